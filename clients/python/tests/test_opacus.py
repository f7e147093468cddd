"""The Opacus integration against the real server: runs in the predictable
mode (the default) that follow the dataset's refresh schedule (full passes and
round-robin blocks, norms at the current model, no 409), a step before the due
refresh refused; an end-to-end run on scikit-learn's digits whose served
epsilons equal ``dpledger replay`` of the trace the integration wrote (the
replay knows the sampled protocol only, so those runs pin it), clipping at
per-example thresholds, noise ``sigma * C``, retired examples left out of
batches, empty batches, lost answers, and ghost clipping."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpledger import Client, Conflict, IndividualBudget, RefreshSchedule, RetryPolicy, TransportFailure
from dpledger.opacus import GHOST_MARGIN, LedgerRun, RefreshDueError, make_private

from conftest import poisson_config, rel
from test_retries import FlakyTransport

DELTA = 1e-5


def digits(n=None):
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    if n is not None:
        x, y = x[:n], y[:n]
    return TensorDataset(x, y)


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def train(run, data, *, epochs, lr=0.5, mode="hooks", seed=1, engine=None):
    engine = engine or PrivacyEngine(accountant="rdp")
    net = model()
    out = make_private(
        engine, run, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=lr),
        data_loader=DataLoader(data, batch_size=32), grad_sample_mode=mode,
        sampling_generator=torch.Generator().manual_seed(seed),
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )
    if mode == "ghost":
        m, opt, criterion, loader = out
    else:
        (m, opt, loader), criterion = out, nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = criterion(m(x), y)
            loss.backward()
            opt.step()
    return m, opt, engine


def served_equals_replay(server, client: Client, ds: str, trace, ids=None):
    """Every example's served epsilon equals the offline replay (to 1e-12),
    and so does the worst case. Returns (served epsilons, worst case)."""
    offline = server.replay(trace, DELTA)
    worst = offline["worst_case"]["epsilon"]
    served = {}
    for ex in offline["examples"]:
        if ids is not None and ex["id"] not in ids:
            continue
        p = client.example_privacy(ds, ex["id"], delta=DELTA)
        assert rel(p.example.epsilon, ex["epsilon"]) <= 1e-12, (ex, p.example.epsilon)
        assert rel(p.example.rdp_epsilon, ex["rdp_epsilon"]) <= 1e-12, (ex, p.example.rdp_epsilon)
        assert rel(p.worst_case.epsilon, worst) <= 1e-12
        assert p.example.epsilon <= p.worst_case.epsilon * (1 + 1e-12)
        assert p.example.guarantee.kind in ("worst_case", "individual_filter")
        # The per-example number that varies: the ledger's estimate.
        served[ex["id"]] = min(p.example.rdp_epsilon, p.worst_case.epsilon)
    return served, worst


def test_end_to_end_digits_matches_replay(server, admin: Client, new_id, tmp_path):
    data = digits()
    n, q, epochs = len(data), 64 / len(data), 3
    ds = new_id()
    # C above most per-example gradient norms, so thresholds spread out below it.
    admin.create_dataset(ds, poisson_config(n, q=q, sigma=1.0, max_grad_norm=5.0, rounding=0.05))
    trace = tmp_path / "trace.jsonl"
    run = LedgerRun(admin.with_token(server.token("trainer", ds)), ds, trace=trace, keep_history=True)
    m, opt, engine = train(run, data, epochs=epochs, lr=0.1)
    run.close()
    steps = epochs * round(n / 64)
    assert run.next_step == steps and len(run.history) == steps and run.duplicates == 0
    assert [t for t, _ in run.history] == list(range(steps))
    assert admin.get_dataset(ds).status.steps == steps
    lines = trace.read_text().splitlines()
    assert len(lines) == steps + 1
    served, worst = served_equals_replay(server, admin, ds, trace)
    assert len(served) == n
    # Per-example accounting pays off: many examples are well below the worst case.
    eps = sorted(served.values())
    assert eps[len(eps) // 4] < 0.9 * worst
    # The thresholds the run clips at are the server's.
    assert run.thresholds.tolist() == admin.thresholds(ds).thresholds
    # Opacus' own accountant saw the same steps at the same rate and noise.
    assert len(engine.accountant.history) >= 1
    assert sum(h[2] for h in engine.accountant.history) == steps
    assert all(h[0] == 1.0 and h[1] == q for h in engine.accountant.history)
    # Opacus' accountant here is RDP: compare with the served RDP worst case; the
    # served headline (PLD) is never above it.
    rdp_worst = admin.worst_case(ds, delta=DELTA).rdp.epsilon
    assert worst <= rdp_worst * (1 + 1e-12)
    assert engine.get_epsilon(DELTA) == pytest.approx(rdp_worst, rel=0.05)
    # The model learned something despite clipping at the thresholds.
    with torch.no_grad():
        x, y = data.tensors
        accuracy = (m(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.5


def test_clipping_at_per_example_thresholds_and_noise(server, admin: Client, new_id):
    data = digits(200)
    C, sigma = 4.0, 0.35
    ds = new_id()
    admin.create_dataset(ds, poisson_config(200, q=0.25, sigma=sigma, max_grad_norm=C, rounding=0.04,
                                            thresholds="predictable",
                                            refresh=RefreshSchedule(full_every=1000)))
    # Thresholds spread over [0, C] (the initial gradient norms are about 2-3):
    # the full pass due before step 0, with chosen norms.
    rng = random.Random(3)
    admin.refresh(ds, list(range(200)), [rng.uniform(0.0, 4.5) for _ in range(200)])
    run = LedgerRun(admin, ds)
    assert run.thresholds.tolist() == admin.thresholds(ds).thresholds
    net = model()
    m, opt, loader = make_private(
        PrivacyEngine(), run, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=data, sampling_generator=torch.Generator().manual_seed(5),
    )
    assert opt.max_grad_norm == C and opt.noise_multiplier == sigma
    x, y = next(iter(loader))
    ids = loader.context.ids.clone()
    assert len(ids) == len(x) > 20
    assert torch.equal(x, data.tensors[0][ids])  # the loader's ids are the items' ids
    nn.CrossEntropyLoss()(m(x), y).backward()
    opt.clip_and_accumulate()
    rec = opt.last_clip
    assert torch.equal(rec.ids, ids)
    assert torch.equal(rec.thresholds, run.thresholds[ids])
    # Recompute every clipped per-sample gradient from grad_sample, in float64.
    params = [p for p in m.parameters() if p.requires_grad]
    f32 = rec.factors.to(torch.float32)
    clipped_sq = torch.zeros(len(ids), dtype=torch.float64)
    true_sq = torch.zeros(len(ids), dtype=torch.float64)
    for p in params:
        gs = p.grad_sample.reshape(len(ids), -1)
        clipped_sq += (gs * f32[:, None]).to(torch.float64).pow(2).sum(1)
        true_sq += gs.to(torch.float64).pow(2).sum(1)
        expected_sum = torch.einsum("i,i...", f32, p.grad_sample)
        assert torch.allclose(p.summed_grad, expected_sum, rtol=1e-5, atol=1e-6)
    clipped, true = clipped_sq.sqrt(), true_sq.sqrt()
    assert torch.allclose(rec.norms, true, rtol=1e-12, atol=0)  # reported: unclipped norms
    assert (clipped <= rec.thresholds).all(), (clipped - rec.thresholds).max()
    was_clipped = true > rec.thresholds
    # Non-vacuous: some examples are clipped below C (Opacus would have kept them
    # whole), others are below their threshold and untouched.
    assert (was_clipped & (true < C)).any()
    assert (~was_clipped).any()
    assert torch.equal(rec.factors[~was_clipped & (true < rec.thresholds * (1 - 1e-6))],
                       torch.ones(int((~was_clipped & (true < rec.thresholds * (1 - 1e-6))).sum()), dtype=torch.float64))
    assert torch.allclose(clipped[was_clipped], rec.thresholds[was_clipped], rtol=2e-6)
    # Noise: std sigma * C per coordinate, added to the clipped sum.
    summed = [p.summed_grad.clone() for p in params]
    opt.add_noise()
    noise = torch.cat([(p.grad - s).flatten() for p, s in zip(params, summed)])
    assert noise.numel() > 2000
    assert noise.std().item() == pytest.approx(sigma * C, rel=0.08)


def test_retired_examples_are_left_out(server, admin: Client, new_id, tmp_path):
    data = digits(300)
    q, sigma, epochs = 0.1, 1.0, 4
    steps = epochs * 10
    full = admin.accountant_epsilon(q, sigma, steps, DELTA, method="rdp").epsilon
    budget = 0.5 * full
    ds = new_id()
    admin.create_dataset(ds, poisson_config(300, q=q, sigma=sigma, max_grad_norm=5.0, rounding=0.05,
                                            individual_budget=IndividualBudget(epsilon=budget, delta=DELTA)))
    trace = tmp_path / "trace.jsonl"
    run = LedgerRun(admin, ds, trace=trace, keep_history=True)
    train(run, data, epochs=epochs, lr=0.1)
    run.close()
    assert run.next_step == steps
    assert len(run.retired_at) > 0
    assert int(run.retired.sum()) == len(run.retired_at) == admin.get_dataset(ds).status.retired
    # A run resumed from the server knows the same retirements (not just zero thresholds).
    resumed = LedgerRun(admin, ds)
    assert torch.equal(resumed.retired, run.retired)
    for step, ids in run.history:
        late = [i for i in ids if run.retired_at.get(i, steps + 1) <= step]
        assert not late, f"step {step} sampled retired examples {late}"
    # Examples with small gradients keep training after others retired.
    assert len(run.retired_at) < 300
    first = min(run.retired_at.values())
    assert sum(len(ids) for step, ids in run.history if step >= first) > 0
    offline = server.replay(trace, DELTA)
    for ex in offline["examples"]:
        p = admin.example_privacy(ds, ex["id"], delta=DELTA).example
        # The sampled protocol's filter keeps its (estimate) ledger within budget.
        assert p.rdp_epsilon <= budget * (1 + 1e-9)
        assert p.retired == (ex["id"] in run.retired_at)
        if p.retired:
            # The replay format has no budget: it keeps charging them; the server stopped.
            assert p.rdp_epsilon <= ex["rdp_epsilon"] * (1 + 1e-12) and p.threshold == 0.0
        else:
            assert rel(p.rdp_epsilon, ex["rdp_epsilon"]) <= 1e-12


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_empty_batches_and_lost_answers(server, admin: Client, new_id, tmp_path, mode):
    """Tiny dataset (empty Poisson batches happen) and a connection that loses
    every other answer: every step is applied exactly once and the trace
    replays to the served epsilons."""
    data = digits(12)
    ds = new_id()
    admin.create_dataset(ds, poisson_config(12, q=0.1, sigma=0.8))
    transport = FlakyTransport(["pass", "pass", "pass"] + ["lose", "pass"] * 40)
    client = Client(server.url, server.admin_token, transport=transport,
                    retry=RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002))
    trace = tmp_path / "trace.jsonl"
    run = LedgerRun(client, ds, trace=trace, keep_history=True)
    m, _, _ = train(run, data, epochs=3, seed=11, mode=mode)
    run.close()
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert run.next_step == 30
    assert sum(1 for _, ids in run.history if not ids) >= 1
    assert run.duplicates >= 10
    assert admin.get_dataset(ds).status.steps == 30
    served_equals_replay(server, admin, ds, trace)


def test_ghost_clipping_agrees_with_grad_sample(server, admin: Client, new_id, tmp_path):
    data = digits(150)
    ds = new_id()
    admin.create_dataset(ds, poisson_config(150, q=0.3, sigma=1.0, max_grad_norm=1.5,
                                            thresholds="predictable",
                                            refresh=RefreshSchedule(full_every=1000)))
    rng = random.Random(4)
    admin.refresh(ds, list(range(150)), [rng.uniform(0.0, 1.0) for _ in range(150)])
    run_h, run_g = LedgerRun(admin, ds), LedgerRun(admin, ds)
    base = model()
    net_h, net_g = copy.deepcopy(base), copy.deepcopy(base)
    m_h, opt_h, loader_h = make_private(
        PrivacyEngine(), run_h, module=net_h, optimizer=torch.optim.SGD(net_h.parameters(), lr=0.1),
        data_loader=data, sampling_generator=torch.Generator().manual_seed(9))
    m_g, opt_g, crit_g, loader_g = make_private(
        PrivacyEngine(), run_g, module=net_g, optimizer=torch.optim.SGD(net_g.parameters(), lr=0.1),
        data_loader=data, grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss(),
        sampling_generator=torch.Generator().manual_seed(9))
    x, y = next(iter(loader_h))
    xg, yg = next(iter(loader_g))
    assert torch.equal(x, xg) and torch.equal(loader_h.context.ids, loader_g.context.ids)
    nn.CrossEntropyLoss()(m_h(x), y).backward()
    opt_h.clip_and_accumulate()
    crit_g(m_g(xg), yg).backward()
    rec_h, rec_g = opt_h.last_clip, m_g.last_clip
    assert torch.equal(rec_h.ids, rec_g.ids)
    # Ghost norms are reported GHOST_MARGIN above the computed ones, which agree
    # with the float64 grad_sample norms well within that margin.
    computed = rec_g.norms / (1 + GHOST_MARGIN)
    assert torch.allclose(computed, rec_h.norms, rtol=GHOST_MARGIN / 10)
    assert (rec_g.norms >= rec_h.norms).all()
    # The true per-sample gradients times the ghost factors stay within the thresholds.
    true = torch.zeros(len(rec_h.ids), dtype=torch.float64)
    for p in m_h.parameters():
        true += p.grad_sample.reshape(len(rec_h.ids), -1).to(torch.float64).pow(2).sum(1)
    assert (true.sqrt() * rec_g.factors <= rec_g.thresholds).all()
    assert (rec_g.factors < 1).any()
    # Same clipped sum (up to the two margins).
    for p_h, p_g in zip(m_h.parameters(), m_g.parameters()):
        assert torch.allclose(p_h.summed_grad, p_g.grad, rtol=1e-3, atol=1e-5)
    # A short ghost-clipping run reports every step; the trace replays exactly.
    ds2 = new_id("ghost-run")
    admin.create_dataset(ds2, poisson_config(150, q=0.1, sigma=1.0))
    trace = tmp_path / "ghost.jsonl"
    run = LedgerRun(admin, ds2, trace=trace)
    train(run, data, epochs=2, mode="ghost")
    run.close()
    assert run.next_step == 20 and admin.get_dataset(ds2).status.steps == 20
    served_equals_replay(server, admin, ds2, trace)


def test_misuse_is_refused(server, admin: Client, new_id, tmp_path):
    data = digits(50)
    ds = new_id()
    admin.create_dataset(ds, poisson_config(60))
    run = LedgerRun(admin, ds)
    net = model()
    with pytest.raises(ValueError, match="50 examples"):
        make_private(PrivacyEngine(), run, module=net,
                     optimizer=torch.optim.SGD(net.parameters(), lr=0.1), data_loader=data)
    ds2 = new_id()
    admin.create_dataset(ds2, poisson_config(50))
    run = LedgerRun(admin, ds2)
    m, opt, loader = make_private(PrivacyEngine(), run, module=net,
                                  optimizer=torch.optim.SGD(net.parameters(), lr=0.1), data_loader=data)
    # A batch that did not come from the loader has unknown ids: refused, nothing reported.
    x, y = data.tensors[0][:5], data.tensors[1][:5]
    nn.CrossEntropyLoss()(m(x), y).backward()
    with pytest.raises(RuntimeError, match="ids of this batch are unknown"):
        opt.step()
    assert admin.get_dataset(ds2).status.steps == 0
    # A new trace for a ledger that already has steps could not be replayed.
    admin.report_step(ds2, 0, [], [])
    with pytest.raises(ValueError, match="trace must start at step 0"):
        LedgerRun(admin, ds2, trace=tmp_path / "late.jsonl")


def test_unconfirmed_report_must_be_confirmed(server, admin: Client, new_id, tmp_path):
    """Every answer of one step is lost: the step raises, stays pending, blocks
    the next report, and confirming it later (a duplicate answer) completes the
    trace, which still replays to the served epsilons."""
    data = digits(40)
    ds = new_id()
    admin.create_dataset(ds, poisson_config(40, q=0.2))
    transport = FlakyTransport(["pass", "pass", "pass", "lose", "lose"])
    client = Client(server.url, server.admin_token, transport=transport,
                    retry=RetryPolicy(attempts=2, backoff=0.001, max_backoff=0.002))
    trace = tmp_path / "trace.jsonl"
    run = LedgerRun(client, ds, trace=trace)  # GET dataset, GET thresholds
    net = model()
    m, opt, loader = make_private(PrivacyEngine(), run, module=net,
                                  optimizer=torch.optim.SGD(net.parameters(), lr=0.1), data_loader=data,
                                  sampling_generator=torch.Generator().manual_seed(2))
    batches = iter(loader)
    x, y = next(batches)
    nn.CrossEntropyLoss()(m(x), y).backward()
    opt.step()  # step 0: answered
    opt.zero_grad()
    x, y = next(batches)
    before = [p.detach().clone() for p in m.parameters()]
    nn.CrossEntropyLoss()(m(x), y).backward()
    with pytest.raises(TransportFailure):
        opt.step()  # step 1: applied by the server, both answers lost
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))  # no update
    assert run.pending is not None and run.pending[0] == 1 and run.next_step == 1
    assert admin.get_dataset(ds).status.steps == 2
    with pytest.raises(RuntimeError, match="never confirmed"):
        run.report([], [])
    assert run.confirm_pending().duplicate
    assert run.next_step == 2 and run.pending is None
    run.report([], [])
    run.close()
    served_equals_replay(server, admin, ds, trace)


def bucket(g: float, r: float, C: float) -> float:
    return min(C, math.ceil(g / r) * r)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_predictable_run_follows_the_schedule(server, admin: Client, new_id, mode, tmp_path):
    """Many steps with a full pass every 15 steps and a block of 24 before the
    others: every due refresh is sent before its step with the norms at the
    model that step starts from, no step is refused, a report moves no
    threshold, and the run clips at the server's thresholds."""
    data = digits(240)
    n, q, e, m, C, r = 240, 0.1, 15, 24, 4.0, 0.04
    ds = new_id()
    admin.create_dataset(ds, poisson_config(n, q=q, max_grad_norm=C, rounding=r, thresholds="predictable",
                                            refresh=RefreshSchedule(full_every=e, block=m)))
    trace = tmp_path / "predictable.jsonl"
    run = LedgerRun(admin.with_token(server.token("trainer", ds)), ds, trace=trace)
    assert run.predictable and run.due_ids() == list(range(n))
    net = model()
    plain = copy.deepcopy(net)  # before Opacus hooks the layers: the reference norms
    out = make_private(
        PrivacyEngine(), run, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.2),
        data_loader=data, grad_sample_mode=mode, criterion=nn.CrossEntropyLoss(),
        sampling_generator=torch.Generator().manual_seed(3),
    )
    m_, opt, loader = (out[0], out[1], out[-1])
    criterion = out[2] if mode == "ghost" else nn.CrossEntropyLoss()
    sent = []
    norms_fn = run.norms_fn

    def checked(ids):
        # The norms at the current model, recomputed one example at a time.
        plain.load_state_dict({k: v.detach().clone() for k, v in net.state_dict().items()})
        x, y = data.tensors
        want = []
        for i in ids:
            plain.zero_grad()
            nn.functional.cross_entropy(plain(x[i:i + 1]), y[i:i + 1]).backward()
            want.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in plain.parameters())))
        got = norms_fn(ids)
        assert torch.allclose(torch.as_tensor(got, dtype=torch.float64),
                              torch.tensor(want, dtype=torch.float64), rtol=1e-4, atol=1e-6)
        sent.append((run.next_step, list(ids), [float(g) for g in got]))
        return got

    run.norms_fn = checked
    steps = 0
    for _ in range(4):
        for x, y in loader:
            before = run.thresholds.clone()
            opt.zero_grad()
            criterion(m_(x), y).backward()
            opt.step()
            steps += 1
            after = run.thresholds
            assert torch.equal(before, after), "a step report moved a threshold"
    assert run.next_step == steps == 40
    # One refresh per step: full passes before 0, 15, 30; blocks (t*m + j) % n between.
    assert [t for t, _, _ in sent] == list(range(steps))
    for t, ids, norms in sent:
        want = list(range(n)) if t % e == 0 else [(t * m + j) % n for j in range(m)]
        assert ids == want, t
    assert run.refreshed_examples == sum(len(ids) for _, ids, _ in sent)
    # The thresholds are the buckets of the last norms sent for each id.
    last = {}
    for _, ids, norms in sent:
        last.update(zip(ids, norms))
    served = admin.thresholds(ds).thresholds
    for i, g in last.items():
        # Within a bucket: the server's rounding only goes up.
        assert served[i] >= min(g, C) and served[i] == pytest.approx(bucket(g, r, C), abs=r + 1e-9), i
    # The run clips at the server's thresholds; the numbers are the threshold ledger's.
    assert run.thresholds.tolist() == served
    p = admin.example_privacy(ds, 0, delta=DELTA).example
    assert p.ledger == "threshold"
    assert admin.get_dataset(ds).status.steps == steps
    # The trace names the protocol and its schedule, so the offline replay
    # runs it too and gives every example the served ex-post bound.
    run.close()
    offline = server.replay(trace, DELTA)
    for ex in offline["examples"][:40]:
        served_ex = admin.example_privacy(ds, ex["id"], delta=DELTA).example
        assert rel(served_ex.ex_post.epsilon, ex["ex_post"]["epsilon"]) <= 1e-12, ex
        assert rel(served_ex.estimate.epsilon, ex["estimate"]["epsilon"]) <= 1e-12, ex


def test_a_step_before_the_due_refresh_is_refused(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(20, q=0.2, thresholds="predictable",
                                            refresh=RefreshSchedule(block=5)))
    run = LedgerRun(admin, ds)
    assert run.due_ids() == [0, 1, 2, 3, 4]
    # The run refuses the step before sending it.
    with pytest.raises(RefreshDueError, match="5 ids of the round-robin block"):
        run.report([1], [0.5])
    assert run.pending is None and run.next_step == 0
    # Sent anyway, the server refuses it (409) and says why.
    with pytest.raises(Conflict, match="scheduled refresh"):
        admin.report_step(ds, 0, [1], [0.5])
    # A refresh in two parts; the step then goes through, and the next block is due.
    run.refresh([0, 1, 2], [0.1, 0.2, 0.3])
    assert run.due_ids() == [3, 4]
    with pytest.raises(RefreshDueError, match="2 ids"):
        run.report([1], [0.5])
    run.refresh([3, 4], [0.4, 0.5])
    assert run.due_ids() is None
    run.report([1], [0.9])
    assert run.thresholds[1].item() == pytest.approx(0.2, abs=0.0101)  # the report moved nothing
    assert run.due_ids() == [5, 6, 7, 8, 9]
    # follow_schedule without a norm function refuses; with one, sends the block.
    with pytest.raises(RefreshDueError, match="no norms_fn"):
        run.follow_schedule()
    assert run.follow_schedule(lambda ids: [0.25] * len(ids)) == 5
    assert run.thresholds[5:10].tolist() == pytest.approx([0.25] * 5, abs=0.0101)
    # A reopened run reads what is due from the server.
    assert LedgerRun(admin, ds).due_ids() is None
    run.report([], [])
    assert LedgerRun(admin, ds).due_ids() == [10, 11, 12, 13, 14]


def test_sampled_mode_has_no_schedule(server, admin: Client, new_id):
    """The old protocol (kept for its estimates): nothing is due, a report moves
    a sampled example's threshold, the numbers are labelled estimates."""
    data = digits(60)
    ds = new_id()
    admin.create_dataset(ds, poisson_config(60, q=0.2))
    run = LedgerRun(admin, ds)
    assert not run.predictable and run.due_ids() is None
    train(run, data, epochs=1)
    assert run.refreshed_examples == 0 and run.next_step == 5
    assert run.thresholds.tolist() == admin.thresholds(ds).thresholds
    p = admin.example_privacy(ds, 0, delta=DELTA).example
    assert p.ledger == "sampled" and p.estimate.kind == "estimate"
