//! Training data addressed by example id: row `i` of `xs` is example `i` of the
//! ledger, so the ids the trainer reports are row numbers.

use crate::error::{Error, Result};
use crate::model::DpModule;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::Path;
use tch::{Kind, Tensor};

/// Features `(n, d)` (float) and labels `(n,)` (int64).
#[derive(Debug)]
pub struct Examples {
    /// Features, one row per example.
    pub xs: Tensor,
    /// Class labels.
    pub ys: Tensor,
}

impl Examples {
    /// Wrap features and labels, checking their shapes.
    pub fn new(xs: Tensor, ys: Tensor) -> Result<Self> {
        let n = xs.size().first().copied().unwrap_or(0);
        if xs.dim() != 2 || ys.dim() != 1 || ys.size()[0] != n {
            return Err(Error::Model(format!(
                "features must be (n, d) and labels (n,), got {:?} and {:?}",
                xs.size(),
                ys.size()
            )));
        }
        Ok(Self {
            xs: xs.to_kind(Kind::Float),
            ys: ys.to_kind(Kind::Int64),
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.xs.size()[0] as usize
    }

    /// True without examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of features.
    pub fn features(&self) -> i64 {
        self.xs.size()[1]
    }

    /// The examples with the given ids (rows), in that order.
    pub fn select(&self, ids: &[u64]) -> Examples {
        let index = Tensor::from_slice(&ids.iter().map(|&i| i as i64).collect::<Vec<_>>());
        Examples {
            xs: self.xs.index_select(0, &index),
            ys: self.ys.index_select(0, &index),
        }
    }

    /// A deterministic random split: `(first, rest)` with `round(fraction * n)`
    /// examples in the first part.
    pub fn split(&self, fraction: f64, seed: u64) -> (Examples, Examples) {
        let n = self.len();
        let mut order: Vec<u64> = (0..n as u64).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        let k = ((fraction * n as f64).round() as usize).min(n);
        (self.select(&order[..k]), self.select(&order[k..]))
    }

    /// Read a CSV file of numbers whose last column is the class label; a first
    /// line that is not numeric is taken as a header. Features are divided by
    /// `scale`.
    pub fn from_csv(path: &Path, scale: f64) -> Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let mut features: Vec<f32> = Vec::new();
        let mut labels: Vec<i64> = Vec::new();
        let mut width = None;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let parsed: std::result::Result<Vec<f64>, _> =
                cells.iter().map(|c| c.parse::<f64>()).collect();
            let values = match parsed {
                Ok(v) => v,
                Err(_) if i == 0 => continue,
                Err(e) => return Err(Error::Model(format!("{}:{}: {e}", path.display(), i + 1))),
            };
            if values.len() < 2 || *width.get_or_insert(values.len()) != values.len() {
                return Err(Error::Model(format!(
                    "{}:{}: expected {} columns, got {}",
                    path.display(),
                    i + 1,
                    width.unwrap_or(2),
                    values.len()
                )));
            }
            let (label, xs) = values.split_last().expect("two columns or more");
            if label.fract() != 0.0 || *label < 0.0 {
                return Err(Error::Model(format!(
                    "{}:{}: label {label} is not a class number",
                    path.display(),
                    i + 1
                )));
            }
            features.extend(xs.iter().map(|&x| (x / scale) as f32));
            labels.push(*label as i64);
        }
        let d = width.map(|w| w as i64 - 1).unwrap_or(0);
        let n = labels.len() as i64;
        Examples::new(
            Tensor::from_slice(&features).view([n, d]),
            Tensor::from_slice(&labels),
        )
    }
}

/// Share of examples whose largest logit is their label.
pub fn accuracy<M: DpModule>(model: &M, data: &Examples) -> f64 {
    if data.is_empty() {
        return 0.0;
    }
    let device = model
        .parameters()
        .first()
        .map(Tensor::device)
        .unwrap_or(tch::Device::Cpu);
    tch::no_grad(|| {
        let predicted = model.forward(&data.xs.to_device(device)).argmax(-1, false);
        predicted
            .eq_tensor(&data.ys.to_device(device))
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_csv_with_header_and_splits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.csv");
        std::fs::write(&path, "a,b,label\n0,16,1\n8,4,0\n16,0,2\n2,2,1\n").unwrap();
        let data = Examples::from_csv(&path, 16.0).unwrap();
        assert_eq!(data.len(), 4);
        assert_eq!(data.features(), 2);
        assert_eq!(Vec::<i64>::try_from(&data.ys).unwrap(), vec![1, 0, 2, 1]);
        assert_eq!(
            Vec::<f32>::try_from(&data.xs.get(1)).unwrap(),
            vec![0.5, 0.25]
        );
        let (a, b) = data.split(0.5, 3);
        assert_eq!((a.len(), b.len()), (2, 2));
        let labels = |e: &Examples| Vec::<i64>::try_from(&e.ys).unwrap();
        let mut all = [labels(&a), labels(&b)].concat();
        all.sort();
        assert_eq!(all, vec![0, 1, 1, 2]);

        std::fs::write(&path, "1,2,0\n1,2\n").unwrap();
        assert!(Examples::from_csv(&path, 1.0).is_err());
        std::fs::write(&path, "1,2,0.5\n").unwrap();
        assert!(Examples::from_csv(&path, 1.0).is_err());
    }
}
