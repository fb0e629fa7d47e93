//! diffusers' `FlowMatchEulerDiscreteScheduler` with its default config and a given
//! `shift` (spec wan.md §3.2): `use_dynamic_shifting = False`, no terminal stretch, no
//! Karras/exponential/beta sigmas, `invert_sigmas = False`, deterministic steps.
//!
//! Owns: the schedule (timesteps and sigmas, bit for bit as diffusers builds them: the
//! training table in f32, `set_timesteps` in f64 then rounded to f32) and the Euler step
//! `x ← x + (σ_{i+1} − σ_i)·v` in f32. Does not own: the sampling loop (`runner::sampler`).

/// Training timesteps of the scheduler (`num_train_timesteps`).
pub const NUM_TRAIN_TIMESTEPS: usize = 1000;

/// The shift function `s·σ / (1 + (s − 1)·σ)` in f32 with f32 constants, as torch applies
/// it to the f32 training table.
fn shift_f32(s: f64, sigma: f32) -> f32 {
    (s as f32 * sigma) / (1.0 + (s - 1.0) as f32 * sigma)
}

/// `numpy.linspace(start, stop, num)` in f64: `i·step + start`, the last value exactly `stop`.
pub fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 0 {
        return Vec::new();
    }
    if num == 1 {
        return vec![start];
    }
    let div = (num - 1) as f64;
    let delta = stop - start;
    let step = delta / div;
    let mut y: Vec<f64> = if step == 0.0 {
        (0..num).map(|i| i as f64 / div * delta + start).collect()
    } else {
        (0..num).map(|i| i as f64 * step + start).collect()
    };
    y[num - 1] = stop;
    y
}

/// A flow-matching Euler schedule: `timesteps` (N) and `sigmas` (N + 1, ending in 0).
#[derive(Clone, Debug, PartialEq)]
pub struct FlowMatchEuler {
    /// The shift s.
    pub shift: f64,
    /// t_i = 1000·σ_i in f32, fed to the transformer.
    pub timesteps: Vec<f32>,
    /// σ_0 … σ_{N−1}, then 0.
    pub sigmas: Vec<f32>,
}

impl FlowMatchEuler {
    /// `FlowMatchEulerDiscreteScheduler(shift=shift).set_timesteps(steps)`.
    pub fn new(steps: usize, shift: f64) -> FlowMatchEuler {
        // __init__: timesteps 1000 … 1 in f32, sigmas = t / 1000, shifted in f32.
        let n_train = NUM_TRAIN_TIMESTEPS as f32;
        let sigma_max = shift_f32(shift, NUM_TRAIN_TIMESTEPS as f32 / n_train) as f64;
        let sigma_min = shift_f32(shift, 1.0 / n_train) as f64;
        // set_timesteps: linspace in f64 of σ·1000, back to σ, shifted again in f64, then f32.
        let train = NUM_TRAIN_TIMESTEPS as f64;
        let ts = linspace(sigma_max * train, sigma_min * train, steps);
        let mut sigmas: Vec<f32> = ts
            .iter()
            .map(|t| {
                let s = t / train;
                (shift * s / (1.0 + (shift - 1.0) * s)) as f32
            })
            .collect();
        let timesteps = sigmas.iter().map(|s| s * n_train).collect();
        sigmas.push(0.0);
        FlowMatchEuler {
            shift,
            timesteps,
            sigmas,
        }
    }

    /// Number of steps N.
    pub fn steps(&self) -> usize {
        self.timesteps.len()
    }

    /// Step i in place: `x ← x + (σ_{i+1} − σ_i)·v`, f32.
    #[track_caller]
    pub fn step(&self, i: usize, x: &mut [f32], v: &[f32]) {
        assert_eq!(
            x.len(),
            v.len(),
            "FlowMatchEuler::step: sample vs model output"
        );
        let dt = self.sigmas[i + 1] - self.sigmas[i];
        for (xv, vv) in x.iter_mut().zip(v) {
            *xv += dt * vv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    // Expected bit patterns printed by diffusers 0.42.1:
    // `s = FlowMatchEulerDiscreteScheduler(shift=S); s.set_timesteps(N)`, then
    // `s.timesteps.view(torch.int32)` and `s.sigmas.view(torch.int32)`.
    #[test]
    fn four_steps_shift_3_match_diffusers_bits() {
        let s = FlowMatchEuler::new(4, 3.0);
        assert_eq!(
            bits(&s.timesteps),
            vec![0x447a0000, 0x44566c4f, 0x441689a3, 0x410edb6e]
        );
        assert_eq!(
            bits(&s.sigmas),
            vec![0x3f800000, 0x3f5b91b9, 0x3f1a268a, 0x3c124925, 0]
        );
    }

    #[test]
    fn ten_steps_shift_12_match_diffusers_bits() {
        let s = FlowMatchEuler::new(10, 12.0);
        assert_eq!(
            bits(&s.timesteps),
            vec![
                0x447a0000, 0x447774ea, 0x447445bf, 0x44702b87, 0x446aaf79, 0x4462fa86, 0x44575b16,
                0x4443d0df, 0x441c1764, 0x42fbf7f0
            ]
        );
        assert_eq!(
            bits(&s.sigmas),
            vec![
                0x3f800000, 0x3f7d654a, 0x3f7a228e, 0x3f75ef22, 0x3f705161, 0x3f686d14, 0x3f5c863b,
                0x3f4883f7, 0x3f1fd66b, 0x3e010204, 0
            ]
        );
    }

    #[test]
    fn three_steps_shift_below_one_match_diffusers_bits() {
        let s = FlowMatchEuler::new(3, 0.7);
        assert_eq!(bits(&s.timesteps), vec![0x447a0000, 0x43ce0d4e, 0x3efb020e]);
        assert_eq!(bits(&s.sigmas), vec![0x3f800000, 0x3ed2ff4a, 0x3a008420, 0]);
    }

    #[test]
    fn minimum_is_shifted_twice() {
        // σ_min(train) = shift(0.001); the last timestep is 1000·shift(σ_min(train)).
        let s = FlowMatchEuler::new(4, 3.0);
        let once = 3.0 * 0.001 / (1.0 + 2.0 * 0.001);
        let twice = 3.0 * once / (1.0 + 2.0 * once);
        assert!((s.sigmas[3] as f64 - twice).abs() < 1e-6);
    }

    #[test]
    fn euler_step_moves_by_sigma_difference() {
        let s = FlowMatchEuler::new(1, 1.0);
        let mut x = vec![1.0f32, 2.0];
        s.step(0, &mut x, &[0.5, -1.0]);
        // σ = [1, 0]: x − v.
        assert_eq!(x, vec![0.5, 3.0]);
    }

    #[test]
    fn linspace_pins_the_end_point() {
        assert_eq!(linspace(0.0, 1.0, 5), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(linspace(3.0, 1.0, 1), vec![3.0]);
    }
}
