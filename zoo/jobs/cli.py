"""What ``train.py`` and ``prune.py`` share around their run: directory names, run files, signals, failures, exit codes.

* **Directory names.** ``${dz_now:FMT}`` is the launch's start time and ``${dz_launch:}`` a random id, both the same
  in every torchrun rank and multirun worker of one launch, so default run directories are unique even for launches
  in the same second. ``${dz_job_dir:${hydra.overrides.task}}`` names a multirun job's directory after its
  overrides (sorted; the run's location, logging and reuse switches left out), so a re-run with an extended override
  list reuses exactly the jobs it repeats.
* **Run files.** Hydra writes nothing into a run directory by itself (``hydra.output_subdir: null`` and a
  console-only job logging config); :func:`open_run_files` writes ``.hydra/`` and attaches ``<job>.log`` once the run
  has claimed its directory (:mod:`zoo.jobs.runs`), so a refused command leaves the directory exactly as it was.
* **Exit codes** (:func:`run_job`). A single run: a user error (:class:`~zoo.errors.ZooError`) is one logged line
  and exit status 2; SIGINT/SIGTERM exit 128 + the signal (training saves ``last`` first); a bug is logged with its
  traceback (console and the run's log) and exits 1. In a multirun every job runs: a failing job leaves
  ``failed.json`` (its overrides, a one-line error and, for a bug, the traceback) and a line in the launch's ledger,
  and :class:`SweepCallback` ends the multirun with exit status 1 after the last job when any job of this launch
  failed.
* **Composition errors** (:func:`guard`): a misspelt key, an unknown group option or a wrongly typed value is one
  message (with the closest valid key) and exit status 2.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import secrets
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import Interrupted, RunConflictError, ZooError, first_line
from ..files import write_json
from ..signals import on_stop_signals, requeue_requested
from .runs import names_a_job

_log = logging.getLogger(__name__)

START_TIME_ENV = "DEPTHZOO_START_TIME"
LAUNCH_ID_ENV = "DEPTHZOO_LAUNCH_ID"
LEDGER_DIR = ".launches"
FAILED_FILE = "failed.json"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"

_LAUNCH: tuple[datetime, str] | None = None


# ---------------------------------------------------------------------------------------- launch and names


def launch() -> tuple[datetime, str]:
    """(start time, id) of this launch: inherited from the environment (multirun workers), else made here and
    broadcast from rank 0 (torchrun); exported so that every process of the launch resolves the same names."""
    global _LAUNCH
    if _LAUNCH is None:
        from ..training.distributed import broadcast_object

        stamp, uid = os.environ.get(START_TIME_ENV), os.environ.get(LAUNCH_ID_ENV)
        mine = (datetime.fromisoformat(stamp) if stamp else datetime.now(), uid or secrets.token_hex(3))
        _LAUNCH = broadcast_object(mine)
        os.environ[START_TIME_ENV], os.environ[LAUNCH_ID_ENV] = _LAUNCH[0].isoformat(), _LAUNCH[1]
    return _LAUNCH


def launch_id() -> str:
    return launch()[1]


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def job_dir_name(overrides: Any, limit: int = 100) -> str:
    """A multirun job's directory name from its overrides (all but location, logging and reuse switches), sorted by
    key, readable when they are plain and short, else shortened and suffixed with ``~`` and a hash of the list."""
    kept = sorted((str(o) for o in overrides if names_a_job(_override_key(str(o)))), key=_override_key)
    raw = ",".join(kept) or "defaults"
    safe = re.sub(r"[^A-Za-z0-9._=,+-]", "_", raw)
    if safe == raw and len(raw) <= limit:
        return raw
    return f"{safe[:limit - 9]}~{hashlib.sha1(raw.encode()).hexdigest()[:8]}"


def register_resolvers() -> None:
    """Register ``dz_now``, ``dz_launch`` and ``dz_job_dir`` (see the module docstring)."""
    from omegaconf import OmegaConf

    resolvers = {"dz_now": lambda fmt: launch()[0].strftime(fmt), "dz_launch": launch_id, "dz_job_dir": job_dir_name}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


# ----------------------------------------------------------------------------------------------- run files


def hydra_context() -> dict[str, Any]:
    """``{"group": sweep dir, "job_num": n, "overrides": [...]}`` in a multirun job; ``{}`` outside Hydra or in a
    single run (``overrides`` is then present alone)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):
        return {}
    overrides = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return {"group": str(hydra_cfg.sweep.dir), "job_num": hydra_cfg.job.num, "overrides": overrides}
    return {"overrides": overrides}


def jobs_sharing_cores() -> tuple[int, str]:
    """How many jobs of this launch run on this machine at once, and what says so: torchrun's local processes, a
    multirun's parallel workers (the joblib launcher's ``n_jobs``; -1: one per core), else 1."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 1:
        return int(local), "torchrun's local processes"
    if not in_multirun():
        return 1, "alone"
    from hydra.core.hydra_config import HydraConfig

    launcher = HydraConfig.get().launcher
    n_jobs = launcher.get("n_jobs") if "joblib" in str(launcher.get("_target_", "")) else None
    if n_jobs is None:
        return 1, "one job at a time"
    cores = os.cpu_count() or 1
    workers = cores + 1 + int(n_jobs) if int(n_jobs) < 0 else int(n_jobs)  # joblib's reading of n_jobs
    return max(1, workers), "the joblib launcher's n_jobs"


def in_multirun() -> bool:
    return "job_num" in hydra_context()


def new_dir_hint() -> str:
    """What a refused run directory's message suggests instead: a new sweep or run directory."""
    return "a new hydra.sweep.dir" if in_multirun() else "a new hydra.run.dir"


def open_run_files(output_dir: str | Path, cfg: Any) -> logging.Handler | None:
    """Once a run owns `output_dir`: write ``.hydra/{config,hydra,overrides}.yaml`` and log to ``<job>.log`` there.

    Returns the file handler (detach it with :func:`close_run_files`); nothing happens outside Hydra.
    """
    try:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):
        return None
    (Path(output_dir) / FAILED_FILE).unlink(missing_ok=True)  # an earlier attempt's failure is no longer current
    folder = Path(output_dir) / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
                       ("overrides.yaml", hydra_cfg.overrides.task)):
        OmegaConf.save(node, folder / name)
    handler = logging.FileHandler(Path(output_dir) / f"{hydra_cfg.job.name}.log")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    return handler


def close_run_files(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger().removeHandler(handler)
        handler.close()


@contextmanager
def run_files(output_dir: str | Path, cfg: Any, enabled: bool = True) -> Iterator[None]:
    """:func:`open_run_files` for the body; an error that ends the run is logged before the log file closes."""
    handler = open_run_files(output_dir, cfg) if enabled else None
    try:
        yield
    except BaseException as exc:
        log_failure(exc)
        raise
    finally:
        close_run_files(handler)


def log_failure(exc: BaseException) -> None:
    """Log how a run ended, once: a user error as one line, an interruption as a warning, anything else (a bug)
    with its traceback."""
    if getattr(exc, "_depthzoo_logged", False) or isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return
    if requeued(exc):
        _log.warning("stopped for SLURM's requeue (%s); the requeued job resumes from this run directory",
                     type(exc).__name__)
    elif isinstance(exc, ZooError):
        _log.error("%s: %s", type(exc).__name__, one_line(exc))
    elif isinstance(exc, Interrupted):
        _log.warning("%s", exc)
    else:
        _log.error("the run stopped on an unexpected error (a bug)", exc_info=exc)
    exc._depthzoo_logged = True


# ----------------------------------------------------------------------------------------------- signals


def requeued(exc: BaseException) -> bool:
    """Whether `exc` only ends a SLURM job that is being requeued (:func:`zoo.jobs.slurm.stopping_for_requeue`;
    imported only then: submitit is the launchers extra)."""
    if not requeue_requested():
        return False
    from .slurm import stopping_for_requeue

    return stopping_for_requeue(exc)


def interruptible() -> Any:
    """SIGINT and SIGTERM raise :class:`~zoo.errors.Interrupted` (training overrides this to save ``last`` first)."""

    def handle(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    return on_stop_signals(handle)


# ------------------------------------------------------------------------------------- failures and ledger


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (a DataLoader worker's wrapped error: the original one)."""
    text = str(exc).strip()
    match = re.search(r"^\w+(?:\.\w+)*(?:Error|Exception): (.+)$", text, re.M) if "Original Traceback" in text else None
    return (match.group(1) if match else first_line(exc))[:500]


def _ledger(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / LEDGER_DIR / f"{launch_id()}.jsonl"


def record_outcome(output_dir: str | Path, status: str, exc: BaseException | None = None) -> None:
    """In a multirun job: append this job's outcome to the launch's ledger; a failure also writes ``failed.json``
    into the job's directory, unless the job was refused that directory (it stays untouched)."""
    context = hydra_context()
    entry: dict[str, Any] = {"status": status, "job": Path(output_dir).name, "overrides": context.get("overrides", [])}
    if exc is not None:
        entry.update(error=type(exc).__name__, message=one_line(exc))
        expected = isinstance(exc, ZooError)
        if not isinstance(exc, RunConflictError):
            write_json(Path(output_dir) / FAILED_FILE, {
                **entry, "launch": launch_id(), "traceback": None if expected else traceback.format_exc()})
    if "group" in context:
        ledger = _ledger(context["group"])
        ledger.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(ledger) + ".lock"), open(ledger, "a") as f:
            f.write(json.dumps(entry) + "\n")


def launch_outcomes(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The outcome of every job of this launch in `sweep_dir` (from the ledger)."""
    path = _ledger(sweep_dir)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_job(cfg: Any, run: Callable[[Any], dict[str, Any]], metric: Callable[[dict[str, Any]], float | None]
            ) -> float | None:
    """Run one job of an entry point with the exit-code rules of the module docstring; returns its metric."""
    multirun = in_multirun()
    output_dir = cfg.paths.output_dir
    try:
        with interruptible():
            results = run(cfg)
    except Interrupted as exc:
        log_failure(exc)
        raise SystemExit(128 + exc.signum) from None
    except Exception as exc:
        log_failure(exc)  # in the console and the run's log (a bug with its traceback)
        if requeued(exc):  # the requeued job is this job's outcome
            from .slurm import requeue_exit

            raise requeue_exit(exc) from exc
        if not multirun:
            raise SystemExit(2 if isinstance(exc, ZooError) else 1) from None
        record_outcome(output_dir, "failed", exc)
        return None
    if multirun:
        record_outcome(output_dir, "completed")
    print(f"run directory: {output_dir}\nresults: {Path(output_dir) / 'results.json'}", flush=True)
    return metric(results)


def _hydra_callback_base() -> type:
    try:
        from hydra.experimental.callback import Callback

        return Callback
    except ImportError:  # pragma: no cover - Hydra is a dependency of the entry points
        return object


class SweepCallback(_hydra_callback_base()):
    """Hydra callback: after the last job of a multirun, exit with status 1 if any job of this launch failed."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        launch()  # fixes and exports the launch id before any worker starts (also with an explicit sweep dir)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self.finish(config.hydra.sweep.dir)

    def finish(self, sweep_dir: str | Path) -> None:
        outcomes = launch_outcomes(sweep_dir)
        failed = [o for o in outcomes if o["status"] == "failed"]
        if not failed:
            return
        print(f"{len(failed)} of {len(outcomes)} job(s) failed:", file=sys.stderr)
        for o in failed:
            print(f"  {o['job']} ({' '.join(o['overrides'])}): {o['error']}: {o['message']}", file=sys.stderr)
        raise SystemExit(1)


# ------------------------------------------------------------------------------------ composition errors


def config_keys(schema: type) -> list[str]:
    """Every dotted key of a structured config schema and each of its prefixes (``model``, ``model.name``)."""
    from omegaconf import OmegaConf

    from .runs import flatten

    leaves = flatten(OmegaConf.to_container(OmegaConf.structured(schema)))
    return sorted({".".join(key.split(".")[:i]) for key in leaves for i in range(1, key.count(".") + 2)})


def closest(word: str, choices: list[str], cutoff: float = 0.75) -> list[str]:
    """The choices most similar to `word` (those within 0.05 of the best score above `cutoff`)."""
    scored = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in choices), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [c for score, c in scored[:3] if score >= max(cutoff, best - 0.05)]


def explain_composition_error(exc: BaseException, keys: list[str]) -> str:
    """One message for a Hydra/OmegaConf composition error: a misspelt key gets the closest valid keys, an unknown
    group option the closest options, a badly typed value what was expected."""
    text, cause = str(exc).strip(), str(exc.__cause__ or "").strip()
    unknown_key = re.search(r"Could not (?:override|append to config\.) '([^']+)'", text)
    if unknown_key and ("not in" in cause or "To append" in text):
        key = unknown_key.group(1)
        close = closest(key, keys)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        return f"{key} is not a config key.{hint} (`--cfg job` prints every key with its value.)"
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text, re.M)
        close = closest(option, options, cutoff=0.5)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        return f"{group}={option} is not an option of the {group} group.{hint} Options: {', '.join(options)}."
    merging = re.match(r"Error merging override (.+)", text)
    if merging and cause:
        return f"{merging.group(1)}: {cause.splitlines()[0]}."
    unknown_value = re.search(r"Key '([^']+)' not in '([^']+)'", cause or text)
    if unknown_value:
        return f"{unknown_value.group(1)} is not a key of {unknown_value.group(2)}."
    if type(exc).__name__ == "OverrideParseException":
        return f"{text.splitlines()[0]}: overrides are key=value (Hydra's override grammar)."
    return first_line(exc)


def guard(main: Callable[[], Any], schema: type, setup: Callable[[], Any] | None = None) -> None:
    """Call a ``@hydra.main`` function so that composition errors become one message and exit status 2.

    `setup` runs first, inside the same boundary: it registers the config schemas and imports the model plugins
    (``$DEPTHZOO_MODULES``), so a plugin that does not import is one line and exit status 2 too. A user error that
    escapes the run (:class:`~zoo.errors.ZooError`) is one line and exit 2; anything else still shows its traceback
    and says it is a bug (exit 1)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..errors import BUG

    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing and exiting 1
    try:
        if setup is not None:
            setup()
        main()
    except ZooError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except (HydraException, OmegaConfBaseException) as exc:
        if previous == "1":  # the user asked for Hydra's full tracebacks
            raise
        print(f"error: {explain_composition_error(exc, config_keys(schema))}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as exc:  # Hydra making the run directory (a run's own errors are handled by run_job)
        if previous == "1":
            raise
        print(f"error: cannot create the run directory {exc.filename or ''} ({exc.strerror}); set hydra.run.dir "
              f"(or hydra.sweep.dir) to a folder you can write to.", file=sys.stderr)
        raise SystemExit(2) from None
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception:
        traceback.print_exc()
        print(BUG, file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous
