"""A cohort: several members trained together in one jitted step, exchanging what
``cohort.exchange`` names (``jdml.exchanges``; DM2's distance relations).

A plain run never comes here: its step is ``jdml.step.train_step``. The cohort's step
(:mod:`jdml.cohort.step`) runs the members in groups (``jdml.layout``), each member's loss the
plain method's, adds the exchange's weighted term, and reuses the plain step's update and
finiteness helpers.
"""
