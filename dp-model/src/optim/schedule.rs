//! Learning-rate schedules: a pure function of the step, so a resumed run continues on the
//! same curve.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A learning rate per optimizer step (counted from 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Schedule {
    /// The same rate throughout.
    Constant {
        /// The rate.
        lr: f64,
    },
    /// `lr * gamma^(step / every)`.
    Step {
        /// The starting rate.
        lr: f64,
        /// Steps between decays.
        every: u64,
        /// Factor per decay.
        gamma: f64,
    },
    /// Linear warmup from `lr / warmup` to `lr` over `warmup` steps, then a cosine from `lr`
    /// down to `min_lr` at step `total`, and `min_lr` after.
    WarmupCosine {
        /// The peak rate.
        lr: f64,
        /// Warmup steps.
        warmup: u64,
        /// Steps until the rate reaches `min_lr`.
        total: u64,
        /// The final rate.
        #[serde(default)]
        min_lr: f64,
    },
}

impl Schedule {
    /// The rate at `step`.
    pub fn lr(&self, step: u64) -> f64 {
        match *self {
            Schedule::Constant { lr } => lr,
            Schedule::Step { lr, every, gamma } => {
                lr * gamma.powi((step / every.max(1)).min(i32::MAX as u64) as i32)
            }
            Schedule::WarmupCosine { lr, warmup, total, min_lr } => {
                if step < warmup {
                    lr * (step + 1) as f64 / warmup as f64
                } else if step >= total {
                    min_lr
                } else {
                    let progress = (step - warmup) as f64 / (total - warmup).max(1) as f64;
                    min_lr + 0.5 * (lr - min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
                }
            }
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, what: String| Err(Error::Optimizer { field, what });
        match *self {
            Schedule::Constant { lr }
            | Schedule::Step { lr, .. }
            | Schedule::WarmupCosine { lr, .. }
                if !(lr.is_finite() && lr > 0.0) =>
            {
                bad("lr", format!("{lr} must be a positive number"))
            }
            Schedule::Step { every: 0, .. } => bad("every", "must be at least 1".into()),
            Schedule::Step { gamma, .. } if !(gamma > 0.0 && gamma <= 1.0) => {
                bad("gamma", format!("{gamma} is outside (0, 1]"))
            }
            Schedule::WarmupCosine { warmup, total, .. } if warmup > total => {
                bad("warmup", format!("{warmup} warmup steps exceed the {total} total"))
            }
            Schedule::WarmupCosine { lr, min_lr, .. } if !(0.0..=lr).contains(&min_lr) => {
                bad("min_lr", format!("{min_lr} is outside [0, lr = {lr}]"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_cosine_rises_then_falls_to_the_floor() {
        let s = Schedule::WarmupCosine { lr: 1.0, warmup: 4, total: 14, min_lr: 0.1 };
        s.validate().unwrap();
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert_eq!(s.lr(4), 1.0);
        assert!((s.lr(9) - 0.55).abs() < 1e-12, "halfway down: {}", s.lr(9));
        assert_eq!(s.lr(14), 0.1);
        assert_eq!(s.lr(1000), 0.1);
        let lrs: Vec<f64> = (4..=14).map(|t| s.lr(t)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn step_decay_and_validation() {
        let s = Schedule::Step { lr: 0.8, every: 10, gamma: 0.5 };
        assert_eq!((s.lr(9), s.lr(10), s.lr(25)), (0.8, 0.4, 0.2));
        assert!(Schedule::Step { lr: 0.8, every: 0, gamma: 0.5 }.validate().is_err());
        assert!(Schedule::Constant { lr: -1.0 }.validate().is_err());
        assert!(
            Schedule::WarmupCosine { lr: 1.0, warmup: 5, total: 4, min_lr: 0.0 }
                .validate()
                .is_err()
        );
    }
}
