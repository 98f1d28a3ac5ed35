"""A referee step that crosses a kink stops at its first crossing, and decides what the whole passes decide.

A step that crosses a kink is only ever shrunk (``gradcheck.check.referee``), so its value is never used: under
``kinks.stopping_at_crossing`` a pass recorded against the reference forward raises ``kinks.Crossed`` at its first
differing kink decision, and ``referee._central`` does not take the other end of a step one end of which crossed.
The last retry's passes run whole: their difference is the one a check records.  Checked here: the stop itself
(where it fires and where it does not), and end to end, on a native model and a ``torch.nn`` module through
``from_torch`` whose relu input sits a few 1e-10 from its kink, that the referee's checks and every verdict are
those of whole passes, clean and with a wrong gradient on the tape, in fewer passes.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_referee_shrink as shrink

from gradcheck import ops
from gradcheck.check import kinks
from gradcheck.check import referee as ref
from gradcheck.check.runner import RunOptions, run_case

REFERENCE = (np.array([1.0, -1.0]), np.array([2.0, 3.0]))


def _pass(second, hold):
    """Two relu calls under a referee pass's recording; returns the recording and how many calls ran."""
    ran = []
    with kinks.recording(stats=False, hold=hold) as rec:
        for x in (REFERENCE[0], second):
            ran.append(ops.relu(x))
    return rec, len(ran)


def test_a_pass_stops_at_its_first_crossing_only_when_asked_and_only_against_a_reference():
    with kinks.recording() as reference:
        for x in REFERENCE:
            ops.relu(x)
    crossing = np.array([2.0, -3.0])
    rec, ran = _pass(crossing, reference)  # not asked: the pass runs to its end and counts the crossing
    assert ran == 2 and kinks.differing(reference, rec) == 1
    with kinks.stopping_at_crossing():
        rec, ran = _pass(REFERENCE[1] * 2, reference)  # crossing nothing: runs whole
        assert ran == 2 and kinks.differing(reference, rec) == 0
        with pytest.raises(kinks.Crossed, match="kink op call 1 \\(relu\\)"):
            _pass(crossing, reference)
        rec, ran = _pass(crossing, None)  # a recording of its own (no reference to hold it to) never stops
        assert ran == 2
    rec, ran = _pass(crossing, reference)  # and after the block, nothing stops
    assert ran == 2


def _torch_near_kink():
    """``Linear -> relu -> Linear`` in float64 with one relu input NEAR above 0 at the case's input."""
    torch = pytest.importorskip("torch")
    from gradcheck import from_torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    x = torch.tensor(shrink.INPUT)
    with torch.no_grad():
        z = net[0](x)[0]
        target = torch.where(torch.arange(4) == 0, torch.tensor(shrink.NEAR, dtype=torch.float64),
                             torch.sign(z) * torch.clamp(z.abs(), min=0.5))
        net[0].bias += target - z
        assert abs(float(net[0](x)[0, 0]) - shrink.NEAR) < 1e-3 * shrink.NEAR
    return from_torch(net, x, seed=0)


def _checks(res):
    return [(x.path, x.verdict, tuple(x.blame), [(c.backend, c.numeric, c.resolution, c.agrees, c.stable)
                                                 for c in x.referee]) for x in res.leaves]


@pytest.mark.parametrize("wrong", [False, True], ids=["clean", "wrong-tape-bias"])
@pytest.mark.parametrize("which", ["native", "from_torch"])
def test_stopped_passes_decide_what_whole_passes_decide(monkeypatch, which, wrong):
    case = shrink.CASE if which == "native" else _torch_near_kink()
    backends = ("tape",) if which == "native" else ("tape", "torch")
    if wrong:
        shrink.wrong_bias_gradient(monkeypatch)
    stops = []
    stop_if_crossed = kinks._stop_if_crossed

    def counted(state):
        try:
            stop_if_crossed(state)
        except kinks.Crossed:
            stops.append(state)
            raise

    monkeypatch.setattr(kinks, "_stop_if_crossed", counted)
    options = RunOptions(backends=backends, referee="leaves")
    stopped = run_case(case, options)
    central = ref._central
    with monkeypatch.context() as m:
        m.setattr(ref, "_central", lambda loss64, point, direction, h, stop=False: central(loss64, point, direction, h))
        whole = run_case(case, options)
    assert stops, "no referee pass crossed the kink: the case does not exercise the stop"
    assert not stopped.errors and not whole.errors, (stopped.errors, whole.errors)
    assert _checks(stopped) == _checks(whole)
    assert stopped.referee_passes < whole.referee_passes
    first_bias = next(x for x in stopped.leaves if x.path.endswith("bias") and x.path.startswith(("0", "layers.0")))
    if wrong:  # the tape's wrong bias gradient is found on the kinked layer's bias by a shrunk step
        assert first_bias.verdict == "disagree" and first_bias.blame == ["tape"], first_bias.message
    else:
        assert stopped.verdict == "agree", [(x.path, x.message) for x in stopped.failing_leaves()]
