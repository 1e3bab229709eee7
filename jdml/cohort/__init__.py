"""A cohort: several members trained together in one jitted step, exchanging what
``cohort.exchange`` names (``jdml.cohort.exchanges``; DM2's distance relations).

A plain run never comes here: its program is ``jdml.program.Program`` and its step
``jdml.step.train_step``. Here, each part of a cohort in its own module:

* ``program.py``: the cohort's program (``CohortProgram``, a ``Program``);
* ``layout.py``: the members' storage (stacked or listed) and placement on the member axis;
* ``members.py``: the members' names, their configs in a heterogeneous cohort, member loops;
* ``step.py``: the state at step 0 and the step: the members in groups, each member's loss the
  plain method's, plus the exchange's weighted term, with the plain step's update and
  finiteness helpers;
* ``embeddings.py``: the members' embeddings by name and the ensemble;
* ``exchanges/``: what the members exchange, by name.
"""
