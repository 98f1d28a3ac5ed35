"""pytest plugin: gradient cross-checks as tests, one report for the whole session.

Loaded through the ``pytest11`` entry point (``-p no:gradcheck`` turns it
off; with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, load it with
``-p gradcheck.app.pytest_plugin``).  Loading it imports neither torch nor jax:
a backend's framework is imported by the first check that uses it.

* ``gradcheck.assert_gradients_agree(model, x)`` inside a test honours the
  ``--gradcheck-*`` options, ini values, ``[tool.gradcheck]`` and the test's
  ``@pytest.mark.gradcheck(...)`` marker (see ``gradcheck.assertions``).
* ``--gradcheck-html/json/junit/markdown PATH`` gather every check of the
  session into one report, written when the session ends.  Under
  pytest-xdist each check travels to the controller on the test report
  (an extra report attribute, so it streams as tests finish and a crashed
  worker loses nothing already reported); only the controller writes.
* ``--gradcheck-suite NAME`` (or ``pytest --pyargs gradcheck.suites``)
  collects a built-in suite, one item per case.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from gradcheck import assertions as A
from gradcheck.app import settings as S
from gradcheck.app.output import FORMATS as REPORT_FORMATS

# Each per-check setting is --gradcheck-<name> and ini gradcheck_<name>; names, help and checks
# are gradcheck.app.settings', shared with `gradcheck run`, [tool.gradcheck] and the assertion.
SETTINGS = S.CHECK_KEYS
MARKER = ("gradcheck(" + ", ".join(f"{k}=None" for k in SETTINGS) + "): "
          "gradient cross-check settings for this test, overriding the --gradcheck-* options")

_STATE = pytest.StashKey["_State"]()
_CONTEXT = pytest.StashKey[A.CheckContext]()
_PENDING = pytest.StashKey[list]()
_EXAMPLES = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("gradcheck", "gradient cross-checks (gradcheck)")
    for name in SETTINGS:
        key = S.KEYS[name]
        text = key.help + (f"; for a check the default is {key.check_default}" if key.check_default else "")
        choices = f" {{{','.join(key.choices)}}}" if key.choices else ""
        group.addoption(_flag(name), dest=f"gradcheck_{name}", metavar=key.metavar, default=None,
                        help=text + choices)
        parser.addini(f"gradcheck_{name}", f"gradcheck: {text}", type="string", default="")
    for fmt in REPORT_FORMATS:
        group.addoption(f"--gradcheck-{fmt}", dest=f"gradcheck_{fmt}", metavar="PATH", default=None,
                        help=f"write one {fmt} report of every gradient check of the session to PATH")
        parser.addini(f"gradcheck_{fmt}", f"gradcheck: path of the session's {fmt} report", type="string",
                      default="")
    group.addoption("--gradcheck-suite", dest="gradcheck_suite", metavar="NAME", action="append", default=[],
                    help="collect a built-in suite (smoke, layers, ...) or package.module:function returning "
                    "cases, one test per case; repeatable or comma-separated")


class _State:
    """Session-wide plugin state (kept in ``config.stash``)."""

    def __init__(self, config):
        self.worker = hasattr(config, "workerinput")  # a pytest-xdist worker never writes reports
        given = {k: config.getoption(f"gradcheck_{k}") for k in SETTINGS}
        ini = config.inipath.name if config.inipath else "ini"
        try:
            base = _pyproject(config)
            ini_layer = S.from_values({k: config.getini(f"gradcheck_{k}") for k in SETTINGS}, ini,
                                      spell=S.spell_ini, text=True, rule_name=f"pytest {ini}: gradcheck_rtol/atol")
            cli_layer = S.from_values(given, "pytest command line", spell=S.spell_flag("--gradcheck-"), text=True,
                                      rule_name="pytest: --gradcheck-rtol/atol")
        except S.SettingsError as exc:
            raise pytest.UsageError(f"gradcheck: {exc}") from None
        self.settings = cli_layer.over(ini_layer.over(base))
        if self.settings.cache_dir is not None:
            _use_compile_cache(self.settings.cache_dir)
        # Replays spell the options as they were typed.
        self.cli_flags = " ".join(f"{_flag(k)} {shlex.quote(v)}" for k, v in given.items() if v not in (None, ""))
        here = Path(config.invocation_params.dir)
        self.reports = {}
        for fmt in REPORT_FORMATS:
            path = config.getoption(f"gradcheck_{fmt}") or config.getini(f"gradcheck_{fmt}")
            if path:
                self.reports[fmt] = here / os.path.expanduser(path)
        if not self.worker:
            from gradcheck.app.output import OutputError, check_file

            # Refused now, not after the session's last test.
            for fmt, path in self.reports.items():
                try:
                    check_file(path, f"--gradcheck-{fmt}")
                except OutputError as exc:
                    raise pytest.UsageError(f"gradcheck: {exc}") from None
        self.suites = [s.strip() for value in config.getoption("gradcheck_suite") for s in value.split(",")
                       if s.strip()]
        self.payloads: list[dict] = []  # every check's case result, as its JSON dict
        self.order: dict[str, int] = {}  # nodeid -> collection index, for a deterministic report
        self.written: list[tuple[str, Path]] = []
        self.failed_writes: list[str] = []
        self.suites_collected = False  # by `pytest --pyargs gradcheck.suites`
        self.config = config

    # This object is registered as a plugin of its own config, so these hooks see
    # this session's state even when pytest runs nested (pytester) in one process.
    def pytest_runtest_logreport(self, report):
        cases = getattr(report, "gradcheck_cases", None)
        if cases and not self.worker:
            self.payloads.extend(json.loads(text) for text in cases)

    def pytest_collection_finish(self, session):
        if session.items:  # an xdist controller collects nothing; its workers' ids arrive below
            self.order = {item.nodeid: i for i, item in enumerate(session.items)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        if not self.order:  # every worker collects the same ids (xdist checks that)
            self.order = {nodeid: i for i, nodeid in enumerate(ids)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.worker or not self.reports:
            return
        from gradcheck.app.output import write_reports

        run = _run_result(self.config, self)
        run.interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        for fmt, path in self.reports.items():
            # GitHub's step summary file is shared by the step: added to, never replaced.
            step = summary if fmt == "markdown" and summary and Path(summary).resolve() == path.resolve() else None
            try:
                self.written += write_reports(run, {fmt: path}, step_summary=step)
            except Exception as exc:  # a missing report fails the session, loudly
                self.failed_writes.append(
                    f"could not write the {fmt} report to {path}: {type(exc).__name__}: {exc}")
        if self.failed_writes:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if self.worker or not (self.payloads or self.reports):
            return
        from gradcheck.results import FAILING

        tr = terminalreporter
        cases = [p["case"] for p in self.payloads]
        failed = [c for c in cases if c.get("verdict") in FAILING]
        # A check a backend was unavailable to is not the cross-check asked for, passing or not.
        partial = [c for c in cases if c.get("unavailable")]
        tr.write_sep("-", "gradcheck")
        tr.write_line(f"{len(cases)} gradient check(s), {len(failed)} failed"
                      + (f", {len(partial)} partial (checked on fewer backends than asked)" if partial else ""),
                      yellow=bool(partial) and not failed)
        missing: dict[str, tuple[str, int]] = {}
        for c in cases:
            for b, why in (c.get("unavailable") or {}).items():
                missing[b] = (why, missing.get(b, ("", 0))[1] + 1)
        for b, (why, n) in missing.items():
            tr.write_line(f"backend {b} skipped in {n} check(s): {why}", yellow=True)
        for fmt, path in self.written:
            tr.write_line(f"{fmt} report: {path}")
        for line in self.failed_writes:
            tr.write_line(line, red=True)


def _flag(setting: str) -> str:
    return "--gradcheck-" + setting.replace("_", "-")


def _use_compile_cache(setting) -> None:
    """``cache_dir`` of ``[tool.gradcheck]``: the folder of the session's persistent caches (jax's compilation
    cache, and from_torch's captures in its ``torch-export`` subfolder); ``false`` turns both off.  Taken when
    the session starts, before any target's module is captured."""
    from gradcheck.app.output import OutputError, check_folder
    from gradcheck.backends.jax import driver as jax_driver

    where = "[tool.gradcheck] cache_dir"
    choice = jax_driver.cache_choice(setting, where)
    if choice.folder is not None:
        try:
            check_folder(choice.folder, choice.source)
        except OutputError as exc:
            raise pytest.UsageError(f"gradcheck: {exc}, or turn the cache off (cache_dir = false)") from None
    jax_driver.use_compile_cache(setting, where)


def _pyproject(config) -> S.Settings:
    """``[tool.gradcheck]`` of the project's pyproject.toml (the ini file, or the one at rootdir)."""
    path = config.inipath if config.inipath and config.inipath.name == "pyproject.toml" else None
    if path is None and (config.rootpath / "pyproject.toml").is_file():
        path = config.rootpath / "pyproject.toml"
    if path is None:
        return S.Settings()
    return S.from_config(path)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)
    state = config.stash[_STATE] = _State(config)
    config.pluginmanager.register(state, "gradcheck-session")
    profile = config.getoption("hypothesis_profile", None)
    if profile and str(profile).startswith("gradcheck"):
        # Registering the profile imports hypothesis; do it only when it is asked
        # for, and before hypothesis' own plugin loads it.
        import gradcheck.strategies  # noqa: F401


def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    if state is not None and config.pluginmanager.is_registered(state):
        config.pluginmanager.unregister(state)


# ---------------------------------------------------------------- around each test
def _marker_settings(item) -> tuple[S.Settings, bool]:
    settings, found = S.Settings(), False
    where = f"{item.nodeid}: @pytest.mark.gradcheck"
    for mark in reversed(list(item.iter_markers("gradcheck"))):  # the closest marker wins
        found = True
        if mark.args:
            raise S.SettingsError(f"{where} takes keyword arguments only (got positional {mark.args!r}); "
                                  "e.g. @pytest.mark.gradcheck(backends=['tape', 'torch'])")
        settings = S.from_values(mark.kwargs, where, rule_name=f"gradcheck marker of {item.nodeid}").over(settings)
    return settings, found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    state = item.config.stash[_STATE]
    pending = item.stash[_PENDING] = []
    examples = item.stash[_EXAMPLES] = {}
    seq = [0]

    def record(result):
        from gradcheck.results import json_default, to_dict

        seq[0] += 1
        text = json.dumps({"nodeid": item.nodeid, "seq": seq[0], "case": to_dict(result)}, default=json_default)
        if A.in_property_test():
            # A property test contributes one case, not one per example: its last
            # failing example (hypothesis re-runs the shrunk one last) or its last passing one.
            examples["failing" if result.failed else "passing"] = text
        else:
            pending.append(text)

    def replay(name):
        return f"pytest {shlex.quote(item.nodeid)}" + (f" {state.cli_flags}" if state.cli_flags else "")

    ctx = item.stash[_CONTEXT] = A.CheckContext(settings=state.settings, nodeid=item.nodeid, record=record,
                                                replay=replay)
    token = A.set_context(ctx)
    try:
        return (yield)
    finally:
        A.reset_context(token)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    ctx = item.stash.get(_CONTEXT, None)
    if ctx is None:
        return
    try:
        marker, found = _marker_settings(item)
    except S.SettingsError as exc:  # a bad marker is this test's setup error, without our traceback
        pytest.fail(str(exc), pytrace=False)
    if found:
        ctx.settings = marker.over(ctx.settings)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    pending = item.stash.get(_PENDING, None)
    examples = item.stash.get(_EXAMPLES, None)
    if examples:
        pending.append(examples.get("failing") or examples["passing"])
        examples.clear()
    if pending:
        # An extra attribute survives pytest-xdist's report serialisation, so each
        # check reaches the controller with the report of the phase that made it.
        report.gradcheck_cases = list(pending)
        pending.clear()
    return report


# ---------------------------------------------------------------- the session report
def _run_result(config, state):
    from gradcheck.check.runner import environment
    from gradcheck.results import RunResult, case_from_dict

    payloads = sorted(state.payloads, key=lambda p: (state.order.get(p["nodeid"], len(state.order)),
                                                     p["nodeid"], p["seq"]))
    env = environment(seed=state.settings.seed if state.settings.seed is not None else 0,
                      command="pytest " + " ".join(shlex.quote(a) for a in config.invocation_params.args))
    env["pytest"] = pytest.__version__
    env["tests"] = sorted({p["nodeid"] for p in payloads}, key=lambda n: (state.order.get(n, len(state.order)), n))
    return RunResult(env=env, cases=[case_from_dict(p["case"]) for p in payloads])


# ---------------------------------------------------------------- fixture
class Gradcheck:
    """The ``gradcheck`` fixture: checks bound to this test's options and marker."""

    def __init__(self, ctx):
        self._ctx = ctx

    @property
    def settings(self) -> S.Settings:
        """The effective settings (command line, ini, pyproject, marker) for this test."""
        return self._ctx.settings

    def __call__(self, model, *inputs, **kwargs):
        """``assert_gradients_agree(model, *inputs, **kwargs)``."""
        __tracebackhide__ = True
        return A.assert_gradients_agree(model, *inputs, **kwargs)

    def check(self, model, *inputs, **kwargs):
        """``check_gradients``: the CaseResult, without raising on disagreement."""
        __tracebackhide__ = True
        return A.check_gradients(model, *inputs, **kwargs)


@pytest.fixture
def gradcheck(request):
    """Cross-check gradients with this test's gradcheck options: ``gradcheck(model, x)``."""
    ctx = request.node.stash.get(_CONTEXT, None) or A.current_context() or A.CheckContext()
    return Gradcheck(ctx)


# ---------------------------------------------------------------- suites as tests
def _suite_cases(target: str, settings: S.Settings) -> list:
    """The cases of a target, as ``gradcheck run`` resolves it (``gradcheck.app.targets``)."""
    from gradcheck.app import targets

    request = targets.Request(dtype=settings.dtype, seed=settings.seed, mode=settings.mode)
    try:
        return targets.resolve([target], request)
    except targets.TargetError as exc:
        raise pytest.UsageError(f"--gradcheck-suite {target}: {exc}") from None


class SuiteCollector(pytest.Collector):
    """One suite: an item per case, in the suite's own (deterministic) order."""

    def __init__(self, *, target: str, **kwargs):
        super().__init__(**kwargs)
        self.target = target

    def collect(self):
        state = self.config.stash[_STATE]
        seen: dict[str, int] = {}
        for case in _suite_cases(self.target, state.settings):
            n = seen[case.name] = seen.get(case.name, 0) + 1
            name = case.name if n == 1 else f"{case.name}#{n}"
            item = SuiteItem.from_parent(self, name=name, case=case, target=self.target)
            item.add_marker("gradcheck")
            yield item


class SuiteItem(pytest.Item):
    """One case of a suite, run through the cross-check like ``gradcheck run``."""

    def __init__(self, *, case, target: str, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.target = target

    def runtest(self):
        from gradcheck.app.targets import replay

        ctx = self.stash.get(_CONTEXT, None) or A.CheckContext()
        command = replay([self.target], ctx.settings)
        ctx.replay = lambda name: command(self.case)
        result = A.run_suite_case(self.case, ctx)
        if result.failed:
            raise A.GradientsDisagree(A.format_failure(result), result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, A.GradientsDisagree):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"gradcheck {self.target}: {self.case.name}"


def _suite_collectors(parent, targets):
    for target in targets:
        yield SuiteCollector.from_parent(parent, name=target, target=target,
                                         nodeid=f"gradcheck/{target}" if parent.nodeid == "" else None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    # tryfirst: -k / -m deselection (later implementations of this hook) sees the suite items too.
    state = config.stash[_STATE]
    if state.suites_collected:  # `--pyargs gradcheck.suites` collected them already
        return
    for collector in _suite_collectors(session, state.suites):
        found = list(collector.collect())
        # Tell the rest of pytest, as its own collection would: counts, --co output, plugins.
        for item in found:
            config.hook.pytest_itemcollected(item=item)
        config.hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, found))
        items.extend(found)


_SUITES_INIT: list = []


def _suites_init() -> Path | None:
    if not _SUITES_INIT:
        import importlib.util

        try:
            spec = importlib.util.find_spec("gradcheck.suites")
        except ImportError:
            spec = None
        _SUITES_INIT.append(Path(spec.origin).resolve() if spec and spec.origin else None)
    return _SUITES_INIT[0]


class SuitesPackage(pytest.File):
    """``pytest --pyargs gradcheck.suites``: every built-in suite (or those named by --gradcheck-suite)."""

    def collect(self):
        state = self.config.stash[_STATE]
        from gradcheck.suites import SUITES

        state.suites_collected = True
        targets = state.suites or list(SUITES)
        for target in targets:
            yield SuiteCollector.from_parent(self, name=target, target=target)


def pytest_collect_file(file_path, parent):
    if file_path.name == "__init__.py" and _suites_init() is not None and file_path.resolve() == _suites_init():
        try:
            from gradcheck.suites import SUITES  # noqa: F401
        except ImportError:
            return None
        return SuitesPackage.from_parent(parent, path=file_path)
    return None
