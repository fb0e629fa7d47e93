//! The embeddings in front of the blocks (spec wan.md §2.2, §2.3): the Conv3d patch
//! embedding, the timestep sinusoid and time MLP, the text projection and the Wan2.1 CLIP
//! image embedder.
//!
//! Owns: these computations on f32 activations. Does not own: input validation
//! (`runner::forward`) or weight storage (`runner::weights`).

use super::error::RunError;
use super::ops::{gelu_erf, gelu_tanh, layer_norm, linear, map_inplace, silu};
use super::weights::WeightSource;

/// Epsilon of the image embedder's LayerNorms (nn.LayerNorm's default, not the config eps).
pub const IMAGE_NORM_EPS: f32 = 1e-5;

/// A Linear layer by diffusers prefix: `prefix.weight` (n, k) and `prefix.bias` (n).
pub fn apply_linear(
    w: &dyn WeightSource,
    prefix: &str,
    x: &[f32],
    rows: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f32>, RunError> {
    let weight = w.tensor(&format!("{prefix}.weight"))?;
    let bias = w.tensor(&format!("{prefix}.bias"))?;
    Ok(linear(x, rows, k, &weight, Some(&bias), n))
}

/// `get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0)` for each
/// timestep: `[cos(t·ω_k) …, sin(t·ω_k) …]` with ω_k = exp(−ln(10000)·k / (dim/2)) in f32.
/// Returns (N, dim).
pub fn timestep_sinusoid(timesteps: &[f32], dim: usize) -> Vec<f32> {
    let half = dim / 2;
    // exponent = (−ln 10000 as f32) · k, then / half, both rounded to f32 as torch does.
    let neg_log = -(10000f64.ln()) as f32;
    let omega: Vec<f32> = (0..half)
        .map(|k| {
            let e = neg_log * k as f32 / half as f32;
            (e as f64).exp() as f32
        })
        .collect();
    let mut out = vec![0f32; timesteps.len() * dim];
    for (row, &t) in out.chunks_mut(dim).zip(timesteps) {
        for (k, &w) in omega.iter().enumerate() {
            let arg = (t * w) as f64;
            row[k] = arg.cos() as f32;
            row[half + k] = arg.sin() as f32;
        }
        // An odd dim is zero-padded at the end, as diffusers does.
    }
    out
}

/// SkyReels-V2's sinusoid (`SkyReelsV2Timesteps`, diffusers'
/// `get_1d_sincos_pos_embed_from_grid` with flip_sin_to_cos): ω_k = 1 / 10000^(k / (dim/2))
/// and t·ω_k in f64, `[cos …, sin …]` rounded to f32. Returns (N, dim); dim must be even.
pub fn sincos_f64(timesteps: &[f32], dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let omega: Vec<f64> = (0..half)
        .map(|k| 1.0 / 10000f64.powf(k as f64 / (dim as f64 / 2.0)))
        .collect();
    let mut out = vec![0f32; timesteps.len() * dim];
    for (row, &t) in out.chunks_mut(dim).zip(timesteps) {
        for (k, &w) in omega.iter().enumerate() {
            let arg = t as f64 * w;
            row[k] = arg.cos() as f32;
            row[half + k] = arg.sin() as f32;
        }
    }
    out
}

/// SkyReels-V2's frame-rate condition: `fps_projection(fps_embedding(fps))`, i.e.
/// `net.2(SiLU(net.0.proj(E[fps])))`, one (6D) row per item; `fps` holds embedding indices.
pub fn fps_projection(w: &dyn WeightSource, fps: &[f32]) -> Result<Vec<f32>, RunError> {
    let d = w.config().inner_dim();
    let table = w.tensor("fps_embedding.weight")?;
    let mut emb = Vec::with_capacity(fps.len() * d);
    for &i in fps {
        let i = i as usize;
        emb.extend_from_slice(&table[i * d..(i + 1) * d]);
    }
    let mut h = apply_linear(w, "fps_projection.net.0.proj", &emb, fps.len(), d, d)?;
    map_inplace(&mut h, silu);
    apply_linear(w, "fps_projection.net.2", &h, fps.len(), d, 6 * d)
}

/// The time path: `temb = linear_2(SiLU(linear_1(sinusoid(t))))` (N, D) and
/// `timestep_proj = time_proj(SiLU(temb))` (N, 6D). A model with `inject_sample_info`
/// (`SkyReelsV2Transformer3DModel`) uses its own sinusoid ([`sincos_f64`]).
pub fn time_embedding(
    w: &dyn WeightSource,
    timesteps: &[f32],
) -> Result<(Vec<f32>, Vec<f32>), RunError> {
    let cfg = w.config();
    let (d, fq, n) = (cfg.inner_dim(), cfg.freq_dim, timesteps.len());
    let sinusoid = if cfg.inject_sample_info {
        sincos_f64(timesteps, fq)
    } else {
        timestep_sinusoid(timesteps, fq)
    };
    let te = "condition_embedder.time_embedder";
    let mut h = apply_linear(w, &format!("{te}.linear_1"), &sinusoid, n, fq, d)?;
    map_inplace(&mut h, silu);
    let temb = apply_linear(w, &format!("{te}.linear_2"), &h, n, d, d)?;
    let mut act = temb.clone();
    map_inplace(&mut act, silu);
    let proj = apply_linear(w, "condition_embedder.time_proj", &act, n, d, 6 * d)?;
    Ok((temb, proj))
}

/// `PixArtAlphaTextProjection`: `linear_2(GELU_tanh(linear_1(text)))`, (rows, T) → (rows, D).
pub fn text_embedding(
    w: &dyn WeightSource,
    text: &[f32],
    rows: usize,
) -> Result<Vec<f32>, RunError> {
    let cfg = w.config();
    let (d, t) = (cfg.inner_dim(), cfg.text_dim);
    let pre = "condition_embedder.text_embedder";
    let mut h = apply_linear(w, &format!("{pre}.linear_1"), text, rows, t, d)?;
    map_inplace(&mut h, gelu_tanh);
    apply_linear(w, &format!("{pre}.linear_2"), &h, rows, d, d)
}

/// `WanImageEmbedding`: for FLF2V the caller's (2B, n, I) tensor is read as (B, 2n, I) (the
/// same memory) and `pos_embed` (1, 2n, I) is added; then LayerNorm(eps 1e-5, affine),
/// Linear I→I, exact GELU, Linear I→D, LayerNorm(eps 1e-5, affine). `image` is
/// (rows, I) with rows = B·tokens; returns (rows, D).
pub fn image_embedding(
    w: &dyn WeightSource,
    image: &[f32],
    rows: usize,
    tokens_per_item: usize,
) -> Result<Vec<f32>, RunError> {
    let cfg = w.config();
    let d = cfg.inner_dim();
    let i = cfg.image_dim.unwrap_or(0);
    let pre = "condition_embedder.image_embedder";
    let mut x = image.to_vec();
    if cfg.pos_embed_seq_len.is_some() {
        let pos = w.tensor(&format!("{pre}.pos_embed"))?;
        for item in x.chunks_mut(tokens_per_item * i) {
            for (v, p) in item.iter_mut().zip(pos.iter()) {
                *v += p;
            }
        }
    }
    let (g1, b1) = (
        w.tensor(&format!("{pre}.norm1.weight"))?,
        w.tensor(&format!("{pre}.norm1.bias"))?,
    );
    layer_norm(&mut x, i, IMAGE_NORM_EPS, Some((&g1, &b1)));
    let mut h = apply_linear(w, &format!("{pre}.ff.net.0.proj"), &x, rows, i, i)?;
    map_inplace(&mut h, gelu_erf);
    let mut out = apply_linear(w, &format!("{pre}.ff.net.2"), &h, rows, i, d)?;
    let (g2, b2) = (
        w.tensor(&format!("{pre}.norm2.weight"))?,
        w.tensor(&format!("{pre}.norm2.bias"))?,
    );
    layer_norm(&mut out, d, IMAGE_NORM_EPS, Some((&g2, &b2)));
    Ok(out)
}

/// A Conv3d patch embedding (kernel = stride = patch) by diffusers prefix (`patch_embedding`,
/// or a VACE model's `vace_patch_embedding`) as a matmul: every token's patch is gathered in
/// (c, a, β, γ) order (γ fastest), the flattening of the Conv3d weight (D, C_in, pt, ph, pw).
/// `x` is (B, C_in, F, H, W); returns (B·S, D) with tokens in (f, h, w) row-major order.
pub fn patch_embedding(
    w: &dyn WeightSource,
    prefix: &str,
    c_in: usize,
    x: &[f32],
    batch: usize,
    frames_hw: [usize; 3],
) -> Result<Vec<f32>, RunError> {
    let cfg = w.config();
    let d = cfg.inner_dim();
    let [pt, ph, pw] = cfg.patch_size;
    let [fl, hl, wl] = frames_hw;
    let (f, h, wd) = (fl / pt, hl / ph, wl / pw);
    let patch = c_in * pt * ph * pw;
    let tokens = f * h * wd;
    let mut cols = vec![0f32; batch * tokens * patch];
    for (bn, row) in cols.chunks_mut(patch).enumerate() {
        let (b, n) = (bn / tokens, bn % tokens);
        let (fi, hi, wi) = (n / (h * wd), (n / wd) % h, n % wd);
        let mut j = 0;
        for c in 0..c_in {
            for a in 0..pt {
                for be in 0..ph {
                    let base =
                        (((b * c_in + c) * fl + fi * pt + a) * hl + hi * ph + be) * wl + wi * pw;
                    row[j..j + pw].copy_from_slice(&x[base..base + pw]);
                    j += pw;
                }
            }
        }
    }
    apply_linear(w, prefix, &cols, batch * tokens, patch, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoid_is_cos_first() {
        // dim 4: half 2, ω = [1, exp(−ln(10000)/2) = 0.01].
        let e = timestep_sinusoid(&[2.0], 4);
        let w1 = (((-(10000f64.ln()) as f32) / 2.0) as f64).exp() as f32;
        assert_eq!(e[0], 2f64.cos() as f32);
        assert_eq!(e[1], ((2.0 * w1) as f64).cos() as f32);
        assert_eq!(e[2], 2f64.sin() as f32);
        assert_eq!(e[3], ((2.0 * w1) as f64).sin() as f32);
        assert!((w1 - 0.01).abs() < 1e-9);
        // t = 0 gives [1, 1, 0, 0].
        assert_eq!(timestep_sinusoid(&[0.0], 4), vec![1.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn skyreels_sinusoid_is_diffusers_f64_grid_embedding() {
        // diffusers 0.42.1 `get_1d_sincos_pos_embed_from_grid(8, tensor([999., 500.]),
        // flip_sin_to_cos=True).float()`, as f32 bits.
        let want: [u32; 16] = [
            0x3f7fe90e, 0x3f4eb59c, 0xbf582f2b, 0x3f0a8861, 0xbcd8c438, 0xbf170545, 0xbf091d4d,
            0x3f574735, 0xbf6243f2, 0x3f770803, 0x3e913c2c, 0x3f60a940, 0xbeef7fc9, 0xbe8655ff,
            0xbf757c10, 0x3ef57744,
        ];
        let got: Vec<u32> = sincos_f64(&[999.0, 500.0], 8)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got, want);
        // WAN's f32 sinusoid differs in 10 of these 16 values (by up to 5e-6).
        assert_ne!(
            timestep_sinusoid(&[999.0, 500.0], 8),
            sincos_f64(&[999.0, 500.0], 8)
        );
    }
}
