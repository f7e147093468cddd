//! Per-example gradient norms and clipping, against separate per-example backward
//! passes (no server needed).

use dpledger_tch::grad::{clip_factors, per_example_norms, per_layer_norms, CLIP_MARGIN};
use dpledger_tch::{Activation, DpModule, Error, LinearTape, Mlp};
use tch::nn::{self, Module};
use tch::{Device, Kind, Reduction, Tensor};

fn ce(logits: &Tensor, ys: &Tensor) -> Tensor {
    logits.cross_entropy_loss::<Tensor>(ys, None, Reduction::None, -100, 0.0)
}

/// The reference: example `i` alone through the model (a batch of one), its own
/// backward pass, the norm of all its parameter gradients (optionally of its loss
/// scaled by `scale`).
fn separate_pass_grads<M: DpModule>(
    model: &M,
    xs: &Tensor,
    ys: &Tensor,
    i: i64,
    scale: f64,
) -> Vec<Tensor> {
    let params = model.parameters();
    let loss =
        ce(&model.forward(&xs.narrow(0, i, 1)), &ys.narrow(0, i, 1)).sum(Kind::Float) * scale;
    Tensor::run_backward(&[loss], &params, false, false)
}

fn norm(grads: &[Tensor]) -> f64 {
    grads
        .iter()
        .map(|g| {
            g.to_kind(Kind::Double)
                .square()
                .sum(Kind::Double)
                .double_value(&[])
        })
        .sum::<f64>()
        .sqrt()
}

/// A model with a bias-free layer and a biased one, taped by hand.
struct Mixed {
    a: nn::Linear,
    b: nn::Linear,
}

impl DpModule for Mixed {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.b.forward(&self.a.forward(xs).relu())
    }
    fn forward_tape(&self, xs: &Tensor) -> Option<(Tensor, Vec<LinearTape>)> {
        let (z, ta) = LinearTape::record(&self.a, xs);
        let (out, tb) = LinearTape::record(&self.b, &z.relu());
        Some((out, vec![ta, tb]))
    }
    fn parameters(&self) -> Vec<Tensor> {
        let mut p = vec![self.a.ws.shallow_clone(), self.b.ws.shallow_clone()];
        p.extend(self.b.bs.iter().map(Tensor::shallow_clone));
        p
    }
}

fn check_norms<M: DpModule>(model: &M, xs: &Tensor, ys: &Tensor) -> Vec<f64> {
    let params = model.parameters();
    let (logits, tape) = model.forward_tape(xs).expect("taped");
    let fast = per_layer_norms(&ce(&logits, ys), &tape, &params).unwrap();
    let batched = per_example_norms(&ce(&model.forward(xs), ys), &params).unwrap();
    assert_eq!(fast.len() as i64, xs.size()[0]);
    for (i, (&f, &b)) in fast.iter().zip(&batched).enumerate() {
        let reference = norm(&separate_pass_grads(model, xs, ys, i as i64, 1.0));
        assert!(reference > 0.0);
        assert!(
            ((f - reference) / reference).abs() < 1e-4,
            "example {i}: per-layer {f} vs separate {reference}"
        );
        assert!(
            ((b - reference) / reference).abs() < 1e-4,
            "example {i}: batched {b} vs separate {reference}"
        );
    }
    fast
}

#[test]
fn per_layer_norms_equal_separate_per_example_backward_passes() {
    tch::manual_seed(11);
    for (activation, dims) in [
        (Activation::Tanh, vec![12, 16, 8, 5]),
        (Activation::Relu, vec![12, 32, 5]),
        (Activation::Tanh, vec![12, 5]),
    ] {
        let vs = nn::VarStore::new(Device::Cpu);
        let model = Mlp::new(&vs.root(), &dims, activation);
        let xs = Tensor::randn([23, 12], (Kind::Float, Device::Cpu)) * 3.0;
        let ys = Tensor::randint(5, [23], (Kind::Int64, Device::Cpu));
        let norms = check_norms(&model, &xs, &ys);
        // Different examples, different norms: the comparison is not vacuous.
        let (min, max) = norms
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &n| (a.min(n), b.max(n)));
        assert!(max > 1.5 * min, "{min} {max}");
    }
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let model = Mixed {
        a: nn::linear(
            &root / "a",
            12,
            9,
            nn::LinearConfig {
                bias: false,
                ..Default::default()
            },
        ),
        b: nn::linear(&root / "b", 9, 4, Default::default()),
    };
    let xs = Tensor::randn([10, 12], (Kind::Float, Device::Cpu));
    let ys = Tensor::randint(4, [10], (Kind::Int64, Device::Cpu));
    check_norms(&model, &xs, &ys);
    // A batch of one and an empty batch.
    check_norms(&model, &xs.narrow(0, 0, 1), &ys.narrow(0, 0, 1));
    let (logits, tape) = model.forward_tape(&xs.narrow(0, 0, 0)).unwrap();
    assert!(per_layer_norms(
        &ce(&logits, &ys.narrow(0, 0, 0)),
        &tape,
        &model.parameters()
    )
    .unwrap()
    .is_empty());
}

#[test]
fn clipping_at_thresholds_never_exceeds_them() {
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Mlp::new(&vs.root(), &[8, 16, 3], Activation::Tanh);
    let params = model.parameters();
    for round in 0..4 {
        let batch = 40;
        let xs = Tensor::randn([batch, 8], (Kind::Float, Device::Cpu)) * (1.0 + 4.0 * round as f64);
        let ys = Tensor::randint(3, [batch], (Kind::Int64, Device::Cpu));
        let (logits, tape) = model.forward_tape(&xs).unwrap();
        let losses = ce(&logits, &ys);
        let norms = per_layer_norms(&losses, &tape, &params).unwrap();
        // Thresholds on the dpledger grid (C = 1, r = 0.01), including 0 (retired),
        // ones far below, near and above the norms.
        let thresholds: Vec<f64> = norms
            .iter()
            .enumerate()
            .map(|(i, &n)| match i % 5 {
                0 => 0.0,
                1 => 0.01,
                2 => ((n * 100.0).ceil() / 100.0).min(1.0),
                3 => ((n * 100.0).floor() / 100.0).min(1.0),
                _ => 1.0,
            })
            .collect();
        let factors = clip_factors(&norms, &thresholds);
        let mut clipped = 0;
        let mut expected: Vec<Tensor> = params.iter().map(Tensor::zeros_like).collect();
        for i in 0..batch as usize {
            let g = separate_pass_grads(&model, &xs, &ys, i as i64, factors[i]);
            let contribution = norm(&g);
            assert!(
                contribution <= thresholds[i],
                "round {round} example {i}: clipped norm {contribution} above threshold {}",
                thresholds[i]
            );
            if norms[i] <= thresholds[i] * (1.0 - CLIP_MARGIN) {
                assert_eq!(
                    factors[i], 1.0,
                    "an example below its threshold is not scaled"
                );
            } else {
                clipped += 1;
            }
            for (e, g) in expected.iter_mut().zip(&g) {
                *e += g;
            }
        }
        assert!(clipped > 0);
        // The weighted backward pass the trainer uses is the sum of clipped gradients.
        let weights = Tensor::from_slice(&factors).to_kind(Kind::Float);
        let total = (losses * weights).sum(Kind::Float);
        let summed = Tensor::run_backward(&[total], &params, false, false);
        for (s, e) in summed.iter().zip(&expected) {
            let diff = (s - e).abs().max().double_value(&[]);
            let scale = e.abs().max().double_value(&[]).max(1e-6);
            assert!(
                diff <= 1e-5 * scale + 1e-7,
                "sum of clipped gradients differs by {diff}"
            );
        }
    }
}

/// A model with a parameter outside its tape: the per-layer method must refuse it,
/// since that parameter's gradient would be missing from the norms.
struct Leaky {
    layer: nn::Linear,
    scale: Tensor,
}

impl DpModule for Leaky {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.layer.forward(xs) * &self.scale
    }
    fn forward_tape(&self, xs: &Tensor) -> Option<(Tensor, Vec<LinearTape>)> {
        let (z, t) = LinearTape::record(&self.layer, xs);
        Some((z * &self.scale, vec![t]))
    }
    fn parameters(&self) -> Vec<Tensor> {
        vec![
            self.layer.ws.shallow_clone(),
            self.layer.bs.as_ref().unwrap().shallow_clone(),
            self.scale.shallow_clone(),
        ]
    }
}

#[test]
fn the_tape_must_cover_every_parameter() {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let model = Leaky {
        layer: nn::linear(&root / "l", 4, 3, Default::default()),
        scale: root.var("scale", &[1], nn::Init::Const(2.0)),
    };
    let xs = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
    let ys = Tensor::randint(3, [5], (Kind::Int64, Device::Cpu));
    let (logits, tape) = model.forward_tape(&xs).unwrap();
    match per_layer_norms(&ce(&logits, &ys), &tape, &model.parameters()) {
        Err(Error::Model(m)) => assert!(m.contains("exactly one taped layer"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The per-example method handles it.
    let norms = per_example_norms(&ce(&model.forward(&xs), &ys), &model.parameters()).unwrap();
    for (i, n) in norms.iter().enumerate() {
        let reference = norm(&separate_pass_grads(&model, &xs, &ys, i as i64, 1.0));
        assert!(((n - reference) / reference).abs() < 1e-4);
    }
}
