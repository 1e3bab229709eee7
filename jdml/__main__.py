"""The ``jdml`` command (also ``python -m jdml``):

* ``jdml train --config CONFIG --workdir RUN``: train (``train.py``'s flags; the configs of
  ``configs/`` are found from any folder, e.g. ``--config revisiting:data=glyphs``);
* ``jdml eval --workdir RUN``: evaluate a checkpoint (``eval.py``'s flags);

and, on the run directories that training writes:

* ``jdml report RUN_DIR... [--out DIR]``: tables and plots over runs, mean and std over seeds;
* ``jdml embed RUN IMAGES --out INDEX``: embed an image folder or .npz into an index file;
* ``jdml search INDEX QUERY...``: the nearest neighbours of query images in an index;
* ``jdml look RUN``: retrieval grid, embedding map, training curves and ``report.html``;
* ``jdml data fetch emoji``: fetch the pinned emoji packages and build the emoji dataset;
* ``jdml data check PATH``: unreadable files, single-image classes and copies across classes;
* ``jdml study run STUDY --dir DIR``: a fair comparison of methods (tune on validation with
  one budget for every row, seeds over Pocock's looks, test once), resumable;
* ``jdml study register STUDY --dir DIR``: pre-register the claims now, training nothing.
* ``jdml study report DIR``: the claims (paired intervals, Holm), the rows and the amendments.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys


def _count(least: int):
    """An argparse type: an integer of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


def _report(args: argparse.Namespace) -> None:
    from jdml.report import report
    from jdml.workdir import check_writable

    if args.out:  # before the runs are read, as ``jdml look`` checks its folder
        check_writable(args.out, "output folder (--out)")
    result = report(
        args.paths,
        args.out,
        split=args.split,
        metrics=args.metrics,
        group_by=args.group_by,
        curve_metric=args.curve_metric,
        embedding=args.embedding,
    )
    print(result["markdown"])
    for name, workdirs in result["experiments"].items():
        print(f"{name}: {len(workdirs)} run(s)")
    print("wrote " + ", ".join(result["files"]))


def _embed(args: argparse.Namespace) -> None:
    from jdml.fileio import check_output_path
    from jdml.inference import collect_images, load

    check_output_path(args.out, "index.npz")  # before the model loads and the images embed
    model = load(args.workdir, args.checkpoint, args.embedding)
    items = collect_images(args.images, model)
    index = model.index(
        items.images,
        labels=items.labels,
        names=items.names,
        class_names=items.class_names,
        batch_size=args.batch_size,
        progress=True,
    )
    index.save(args.out)
    labelled = f", {len(items.class_names)} classes" if items.class_names else ""
    print(
        f"wrote {args.out}: {len(index)} items{labelled}, {index.embeddings.shape[1]}-d "
        f"embedding {model.embedding!r} of {args.workdir} ({model.fingerprint['checkpoint']}, "
        f"step {model.step})"
    )


def _check_query_files(index: str, queries: list[str]) -> None:
    """Refuses a folder among the queries of ``jdml search`` (image files or one .npz),
    naming what to give instead."""
    from jdml.errors import DataError

    for query in queries:
        if os.path.isdir(query):
            raise DataError(
                f"query {query} is a folder, not an image file: give its images, e.g. jdml "
                f"search {index} {os.path.join(query, '*.jpg')}, or an .npz of query images"
            )


def _search(args: argparse.Namespace) -> None:
    from jdml.fileio import check_output_path
    from jdml.inference import Index, collect_images, hits_table, load

    if args.json:
        check_output_path(args.json, "hits.json")  # before the search runs
    _check_query_files(args.index, args.queries)
    index = Index.load(args.index)
    fingerprint = index.fingerprint
    model = load(
        args.workdir or fingerprint["workdir"],
        args.checkpoint or fingerprint["step"],
        args.embedding or fingerprint["embedding"],
    )
    queries = collect_images(args.queries, model, files_only=True)
    embeddings = model.embed(queries.images)
    hits = index.search(embeddings, args.k, fingerprint=model.fingerprint, backends=model.backends)
    print(hits_table(queries.names, hits, index.class_names))
    if args.json:
        from jdml.fileio import atomic_write

        results = [
            {"query": q, "neighbours": [h.as_dict(index.class_names) for h in row]}
            for q, row in zip(queries.names, hits, strict=True)
        ]
        atomic_write(args.json, json.dumps({"index": args.index, "results": results}, indent=2))
        print(f"wrote {args.json}")


def _look(args: argparse.Namespace) -> None:
    import os

    from jdml.look import LookOptions, look
    from jdml.workdir import check_writable

    check_writable(args.out or os.path.join(args.workdir, "look"), "output folder")
    options = LookOptions(
        split=args.split,
        queries=args.queries,
        neighbours=args.k,
        classes=args.classes,
        method=args.method,
        seed=args.seed,
    )
    out = look(
        args.workdir,
        checkpoint=args.checkpoint,
        embedding=args.embedding,
        out=args.out,
        options=options,
    )
    print("wrote " + ", ".join(out.values()))


EXPORT_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def _platforms(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in EXPORT_PLATFORMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown platform(s) {unknown or [text]}; choose from {', '.join(EXPORT_PLATFORMS)}"
        )
    return names


def _export(args: argparse.Namespace) -> None:
    from jdml.fileio import check_output_path
    from jdml.inference import load
    from jdml.workdir import check_writable

    check_output_path(args.out, "model.jaxexp")  # the program and its description, both
    check_output_path(args.out + ".json")
    check_writable(os.path.dirname(os.path.abspath(args.out)), "output folder")
    model = load(args.workdir, args.checkpoint, args.embedding)
    info = model.export(args.out, args.platforms)
    print(
        f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) and {args.out}.json: "
        f"embedding {info['embedding']!r} ({info['output']['shape'][1]}-d) of {args.workdir} "
        f"(step {info['step']}) for {', '.join(info['platforms'])}, images of shape "
        f"(batch, {', '.join(map(str, info['input']['shape'][1:]))}) in [0, 1]"
    )


def _data_fetch(args: argparse.Namespace) -> None:
    import time

    from jdml.data import emoji
    from jdml.data.notices import stamp
    from jdml.fileio import check_output_path
    from jdml.workdir import check_writable

    check_writable(str(emoji.cache_paths(args.cache_dir)[0].parent), "cache folder (--cache-dir)")
    if args.sheet:
        check_output_path(args.sheet, "sheet.png")
    start = time.perf_counter()
    manifest = emoji.fetch_and_build(args.cache_dir, emoji.SOURCES)
    stats, dup = manifest["stats"], manifest["duplicates"]
    npz_path = emoji.cache_paths(args.cache_dir)[0]
    print(
        f"emoji: {stats['num_classes']} classes, {stats['num_images']} images, designs "
        f"{stats['per_design']}, per class {stats['per_class']}; dropped as copies "
        f"(RMS <= {dup['rms_threshold']:g}): {dup['images_dropped']} drawings, "
        f"{len(dup['classes_dropped'])} classes; {npz_path} "
        f"({npz_path.stat().st_size / 1e6:.1f} MB), {time.perf_counter() - start:.1f} s"
    )
    if args.sheet:
        arrays, _ = emoji.read_cache(args.cache_dir)
        stamp(emoji.contact_sheet(arrays)).save(args.sheet)
        print(f"contact sheet written to {args.sheet}")


def _data_check(args: argparse.Namespace) -> None:
    import json

    from jdml.data.check import check, format_report
    from jdml.fileio import atomic_write, check_output_path

    if args.json:
        check_output_path(args.json, "check.json")
    reports = check(args.path, args.dataset, image_size=args.image_size, threshold=args.threshold)
    print(format_report(reports, args.threshold))
    if args.json:
        payload = [dataclasses.asdict(r) for r in reports]
        atomic_write(args.json, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    if not all(r.clean for r in reports):
        raise SystemExit(1)


def _study_run(args: argparse.Namespace) -> None:
    import shlex

    from jdml.errors import StudyError
    from jdml.study import executor as ex
    from jdml.study import runner, spec

    study = spec.load(args.study)
    if args.executor == "ray":
        if not args.address:
            raise StudyError(
                "--executor ray needs --address: the cluster's (e.g. auto, or host:6379)"
            )
        executor = ex.RayTasks(args.address, args.slots, args.cpus_per_run, args.gpus_per_run)
    else:
        executor = ex.Local(args.slots)
    command = ""
    if args.record_command:
        argv = ["jdml", "study", "run", args.study, "--dir", args.dir]
        if args.executor == "ray":
            argv += ["--executor", "ray", "--address", args.address]
            argv += [
                f"--cpus-per-run={args.cpus_per_run:g}",
                f"--gpus-per-run={args.gpus_per_run:g}",
            ]
        argv += [f"--slots={args.slots}"] + ([f"--storage={args.storage}"] if args.storage else [])
        argv += [] if args.xla_cache else ["--no-xla-cache"]
        command = shlex.join(argv)
    previous = ex.stop_on_sigterm()
    try:
        runner.run(
            study,
            args.dir,
            executor,
            echo=lambda s: print(s, flush=True),
            command=command,
            storage=args.storage,
            xla_cache=args.xla_cache,
        )
    finally:
        executor.close()
        import signal

        signal.signal(signal.SIGTERM, previous)


def _study_register(args: argparse.Namespace) -> None:
    from jdml.study import runner, spec

    study = spec.load(args.study)
    runner.register(study, args.dir, echo=lambda s: print(s, flush=True))


def _study_report(args: argparse.Namespace) -> None:
    from jdml.study.report import part, plot_claims, report

    if args.print:
        print(part(args.dir, args.print, args.seeds, args.title), end="")
        if args.plot and plot_claims(args.dir, args.plot):
            print(f"wrote {args.plot}", file=sys.stderr)  # stdout: the part alone
        return
    out = report(args.dir, args.out)
    print(out["markdown"])
    print("wrote " + ", ".join(out["files"]))


def _model_arguments(p: argparse.ArgumentParser, checkpoint_default: str | None) -> None:
    p.add_argument(
        "--checkpoint",
        default=checkpoint_default,
        help="best, latest or a step number"
        + (f" (default {checkpoint_default})" if checkpoint_default else ""),
    )
    p.add_argument(
        "--embedding",
        help="a head (e.g. shared, member2), concat:<weights> over eval.heads, or ensemble (a "
        "DM2 cohort's members concatenated); default the run's main head",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jdml", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (("train", "train a model"), ("eval", "evaluate a checkpoint")):
        # Listed for --help only: main() hands these to their absl-flag commands.
        sub.add_parser(name, help=f"{what} (flags: jdml {name} --help)", add_help=False)
    r = sub.add_parser(
        "report",
        help="tables (Markdown, CSV) and plots over training runs, mean and std over seeds",
        description="Collects run directories into the Revisiting paper's protocol: per metric "
        "the value at the selected checkpoint and the maximum over epochs, rho on the training "
        "set at the best epoch, mean and std over seeds; plots the selection metric over epochs "
        "and the training embeddings' singular-value spectrum.",
    )
    r.add_argument("paths", nargs="+", help="run directories, or directories holding them")
    r.add_argument("--out", help="output directory (default: <common parent>/report)")
    r.add_argument("--split", default="test", help="split to report (default: test)")
    r.add_argument("--metrics", nargs="+", help="metric columns (default: all evaluated)")
    r.add_argument(
        "--group-by",
        choices=("config", "dir"),
        default="config",
        help="experiments = configs equal up to the seed (default), or parent directories",
    )
    r.add_argument("--curve-metric", default="recall@1", help="metric plotted over epochs")
    r.add_argument(
        "--embedding",
        help="multi-head runs: report this head or concatenation (e.g. concat:0.5,1,1,1) "
        "instead of the main head; the checkpoint is still selected on the main head",
    )
    r.set_defaults(func=_report)

    e = sub.add_parser(
        "embed",
        help="embed an image folder or .npz with a checkpoint into an index file",
        description="Embeds images with a run's checkpoint into an index (.npz: embeddings, "
        "labels, file names and the model's fingerprint). IMAGES is a folder of class folders "
        "(labels from their names), a folder of images (no labels), or an .npz with 'images' "
        "(and optional 'labels', 'class_names').",
    )
    e.add_argument("workdir", help="a training run directory")
    e.add_argument("images", help="image folder or .npz")
    e.add_argument("--out", required=True, help="the index file to write (.npz)")
    e.add_argument("--batch-size", type=_count(1), default=256)
    _model_arguments(e, "best")
    e.set_defaults(func=_embed)

    s = sub.add_parser(
        "search",
        help="the nearest neighbours of query images in an index",
        description="Embeds each query image with the checkpoint that built the index (or the "
        "one given) and prints its k nearest items; --json writes them.",
    )
    s.add_argument("index", help="an index file written by `jdml embed`")
    s.add_argument("queries", nargs="+", help="query image files (or an .npz of images)")
    s.add_argument("-k", type=_count(1), default=5, help="neighbours per query (default 5)")
    s.add_argument("--json", help="write the results to this JSON file")
    s.add_argument("--workdir", help="the run to embed queries with (default: the index's)")
    _model_arguments(s, None)
    s.set_defaults(func=_search)

    lk = sub.add_parser(
        "look",
        help="retrieval grid, embedding map, training curves and an HTML report of a run",
        description="Embeds a split of the run with a checkpoint and draws a retrieval grid "
        "(queries and nearest neighbours, correct ones framed green), an embedding map (2-D "
        "projection coloured by class, one panel per head for multi-head runs), the training "
        "curves and the spectrum, gathered in report.html.",
    )
    lk.add_argument("workdir", help="a training run directory")
    lk.add_argument("--out", help="output folder (default <workdir>/look)")
    lk.add_argument("--split", default="test", help="split to look at (default test)")
    lk.add_argument("--queries", type=_count(1), default=6, help="queries in the grid (default 6)")
    lk.add_argument("-k", type=_count(1), default=6, help="neighbours per query (default 6)")
    lk.add_argument(
        "--classes", type=_count(0), default=20, help="classes in the map (default 20, 0 = all)"
    )
    lk.add_argument(
        "--method",
        choices=("auto", "umap", "tsne", "pca"),
        default="auto",
        help="2-D projection (auto: UMAP if installed, else t-SNE, PCA for many points)",
    )
    lk.add_argument("--seed", type=_count(0), default=0)
    _model_arguments(lk, "best")
    lk.set_defaults(func=_look)

    x = sub.add_parser(
        "export",
        help="serialize a checkpoint's embedding function with its weights (jax.export)",
        description="Writes the embedding of a checkpoint as a jax.export module (any batch "
        "size; float32 images in [0, 1] in, embeddings out) and a JSON description next to it. "
        "It runs with only jax and numpy: jax.export.deserialize(bytearray(open(path, 'rb')"
        ".read())).call(images).",
    )
    x.add_argument("workdir", help="a training run directory")
    x.add_argument("--out", required=True, help="the file to write (e.g. model.jaxexp)")
    x.add_argument(
        "--platforms",
        type=_platforms,
        default=("cpu",),
        help="comma-separated: cpu, cuda, rocm, tpu (default cpu)",
    )
    _model_arguments(x, "best")
    x.set_defaults(func=_export)

    d = sub.add_parser("data", help="fetch, build and check datasets")
    actions = d.add_subparsers(dest="action", required=True)
    fetch = actions.add_parser("fetch", help="fetch a dataset's pinned sources and build its cache")
    fetch.add_argument("dataset", choices=("emoji",))
    fetch.add_argument("--cache-dir", help="default: $JDML_CACHE/emoji or ~/.cache/jdml/emoji")
    fetch.add_argument("--sheet", help="also write a contact sheet PNG here")
    fetch.set_defaults(func=_data_fetch)
    chk = actions.add_parser(
        "check",
        help="report unreadable files, single-image classes and copies across classes; exits "
        "1 if it finds any",
    )
    chk.add_argument(
        "path",
        help="a dataset folder or .npz file, an emoji cache folder, or a registered name "
        "(emoji, glyphs)",
    )
    chk.add_argument(
        "--dataset",
        help="the loader or benchmark that reads PATH (folder, npz, emoji, glyphs, tfds, cub200, "
        "cars196, sop, inshop); default: guessed from PATH",
    )
    chk.add_argument("--image-size", type=_count(8), default=64, help="compared at this size")
    chk.add_argument(
        "--threshold",
        type=float,
        default=6.0,
        help="RMS pixel distance (0-255) at or under which two images are copies",
    )
    chk.add_argument("--json", help="also write the full report (every group) here")
    chk.set_defaults(func=_data_check)

    st = sub.add_parser(
        "study",
        help="a fair comparison of methods: tune, seeds, test once, claims with Holm",
        description="Runs a study file (rows, data, selection split, one tuning budget per row, "
        "looks of seeds, pre-registered claims) into a folder, and reports it from its records.",
    )
    phases = st.add_subparsers(dest="action", required=True)
    sr = phases.add_parser("run", help="run or resume a study into --dir")
    sr.add_argument("study", help="a study file (its get_study() returns a jdml.study.Study)")
    sr.add_argument("--dir", required=True, help="the study's folder (runs, records, ledger)")
    sr.add_argument("--executor", choices=("local", "ray"), default="local")
    sr.add_argument(
        "--slots",
        type=_count(1),
        default=1,
        help="runs at once (local: each on its share of "
        "the cores and of the accelerator's memory; ray: tasks submitted at once)",
    )
    sr.add_argument("--address", help="ray: the cluster's address (auto, or host:port)")
    sr.add_argument("--cpus-per-run", type=float, default=1.0, help="ray: CPUs of each run")
    sr.add_argument(
        "--gpus-per-run",
        type=float,
        default=0.0,
        help="ray: GPUs of each run (0.25: four share one)",
    )
    sr.add_argument(
        "--storage", help="Optuna's storage URL (default the journal file DIR/optuna.journal)"
    )
    sr.add_argument(
        "--no-xla-cache",
        dest="xla_cache",
        action="store_false",
        help="compile every run's programs anew (default: the runs share XLA's compiled "
        "programs in DIR/xla_cache)",
    )
    sr.add_argument(
        "--no-record-command",
        dest="record_command",
        action="store_false",
        help="leave the command out of study.json (the report shows it by default)",
    )
    sr.set_defaults(func=_study_run)
    rg = phases.add_parser(
        "register",
        help="pre-register the study's claims now (or record their change as an amendment), "
        "training nothing",
        description="Freezes the study's pre-registration (claims, family, the papers' effects, "
        "looks, stopping rule) in DIR's ledger now, with how many test results exist; if one is "
        "frozen and differs, records the change as an amendment. Nothing is trained.",
    )
    rg.add_argument("study", help="the study file (FILE or FILE:ARG)")
    rg.add_argument("--dir", required=True, help="the study's folder")
    rg.set_defaults(func=_study_register)
    rp = phases.add_parser("report", help="the claims, rows and amendments of a study folder")
    rp.add_argument("dir", help="a study folder written by jdml study run")
    rp.add_argument("--out", help="output folder (default DIR/report)")
    rp.add_argument(
        "--print",
        metavar="PART",
        help="print one part of the page to stdout and write nothing: claims (the table, with "
        "what Holm's correction changes and the claims smaller than their paper's effect), "
        "claims-before (the table as it read before seeds were trained again or a look decided "
        "again), readings (one paragraph per paper), seeds-needed, design, classes (the class "
        "bootstrap), tune (every candidate), selection (each row's tuning and its runs), "
        "registration (when the claims, family and effects were frozen and amended, and the "
        "test results after), "
        "budget:N (whether the last N epochs still add on validation), or "
        "table:ROW,ROW,... (the rows side by side, each against the first)",
    )
    rp.add_argument(
        "--seeds", type=int, metavar="N", help="--print table: read seeds 0 to N-1 only"
    )
    rp.add_argument("--title", help="--print table: the table's first header cell")
    rp.add_argument("--plot", help="with --print: also draw the claims' forest plot to this PNG")
    rp.set_defaults(func=_study_report)
    return p


# The commands that take absl flags (ml_collections config overrides) rather than argparse ones.
FLAG_COMMANDS = ("train", "eval")


def main(argv: list[str] | None = None) -> None:
    from jdml.allocator import reexec_with_tcmalloc
    from jdml.cli import run_cli
    from jdml.errors import IndexFileError, IndexMismatchError, ReportError, StudyError

    if argv is None:  # as a program: under tcmalloc where installed (jdml.allocator)
        reexec_with_tcmalloc()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in FLAG_COMMANDS:
        command = importlib.import_module(f"jdml.commands.{argv[0]}")
        command.run([f"jdml {argv[0]}", *argv[1:]])
        return
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    run_cli(
        lambda: args.func(args), extra=(ReportError, IndexFileError, IndexMismatchError, StudyError)
    )


if __name__ == "__main__":
    main()
