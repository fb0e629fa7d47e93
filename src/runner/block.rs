//! One `WanTransformerBlock` (spec wan.md §2.4): modulated self-attention with q/k RMSNorm
//! over the full width and 3D RoPE, un-gated cross-attention to the text (and, for Wan2.1
//! I2V/FLF2V, the image tokens through add_k/add_v), and the modulated GELU(tanh) FFN. A VACE
//! context block (`vace_blocks.n`) is the same block under another prefix (`BlockId`); its
//! two extra projections belong to `runner::vace`.
//!
//! Owns: the block's arithmetic, the modulation lookup (per item, or per token for
//! Wan2.2 TI2V), and `CrossKv`, the cross-attention keys and values that depend only on the
//! context (computed once per sampling run). Weights are fetched from the `WeightSource`
//! when the block runs and dropped when it ends. Does not own: the embeddings or the output head
//! (`runner::forward`).

use super::attention::{AttentionShape, attention};
use super::embed::apply_linear;
use super::error::RunError;
use super::ops::{
    ROW_TILE, for_each_row, gelu_tanh, layer_norm, layer_norm_row, linear, map_inplace, rms_norm,
};
use super::rope::rotate_pairs;
use super::weights::WeightSource;

/// Rows of the FFN hidden layer computed at a time (a multiple of the matmul row tile, so
/// chunking does not change any value).
pub const FFN_ROWS: usize = 16 * ROW_TILE;

/// Which block: one of the main stack (`blocks.i`) or a VACE context block
/// (`vace_blocks.n`, the same submodules under another prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockId {
    /// `blocks.i`.
    Main(usize),
    /// `vace_blocks.n`.
    Vace(usize),
}

impl BlockId {
    /// The diffusers parameter prefix, without a trailing dot.
    pub fn prefix(self) -> String {
        match self {
            BlockId::Main(i) => format!("blocks.{i}"),
            BlockId::Vace(n) => format!("vace_blocks.{n}"),
        }
    }
}

/// What every block of one forward shares.
#[derive(Clone, Copy, Debug)]
pub struct BlockInputs<'a> {
    /// Batch size B.
    pub batch: usize,
    /// Tokens per item S.
    pub tokens: usize,
    /// timestep_proj: (B, 6D), or (B·S, 6D) when `per_token`.
    pub timestep_proj: &'a [f32],
    /// Whether `timestep_proj` has one row per token.
    pub per_token: bool,
    /// RoPE cos per token, (S, Dh/2).
    pub rope_cos: &'a [f32],
    /// RoPE sin per token, (S, Dh/2).
    pub rope_sin: &'a [f32],
}

/// Keys and values of one attention branch over a fixed context: (B, len, D) each.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyValues {
    /// RMS-normalised keys.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
    /// Context tokens per item.
    pub len: usize,
}

/// The cross-attention keys and values of one block: they depend only on the text (and
/// image) context and the block's weights, so a sampler computes them once per run.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossKv {
    /// Text branch (to_k / norm_k, to_v).
    pub text: KeyValues,
    /// Image branch of Wan2.1 I2V/FLF2V (add_k_proj / norm_added_k, add_v_proj).
    pub image: Option<KeyValues>,
}

/// Block `id`'s cross-attention keys and values for a text context (B, Lt, D) and, for
/// a model with add_k_proj, an image context (B, Li, D).
pub fn cross_kv(
    w: &dyn WeightSource,
    id: BlockId,
    batch: usize,
    text: (&[f32], usize),
    image: Option<(&[f32], usize)>,
) -> Result<CrossKv, RunError> {
    let cfg = w.config();
    let (d, eps) = (cfg.inner_dim(), cfg.eps as f32);
    let a = format!("{}.attn2", id.prefix());
    let branch = |ctx: &[f32], len: usize, k_name: &str, norm: &str, v_name: &str, k_in: usize| {
        let rows = batch * len;
        let mut k = apply_linear(w, &format!("{a}.{k_name}"), ctx, rows, k_in, d)?;
        rms_norm(&mut k, d, eps, &w.tensor(&format!("{a}.{norm}.weight"))?);
        let v = apply_linear(w, &format!("{a}.{v_name}"), ctx, rows, k_in, d)?;
        Ok::<_, RunError>(KeyValues { k, v, len })
    };
    let text = branch(text.0, text.1, "to_k", "norm_k", "to_v", d)?;
    let image = match image {
        Some((ctx, len)) => {
            let kv_in = cfg.added_kv_proj_dim.unwrap_or(d);
            Some(branch(
                ctx,
                len,
                "add_k_proj",
                "norm_added_k",
                "add_v_proj",
                kv_in,
            )?)
        }
        None => None,
    };
    Ok(CrossKv { text, image })
}

impl BlockInputs<'_> {
    /// The row of `timestep_proj` (or temb) used by activation row `r` (= b·S + s).
    pub fn time_row(&self, r: usize) -> usize {
        if self.per_token { r } else { r / self.tokens }
    }
}

/// Runs block `id` on x (B·S, D) in place, with that block's cross-attention keys and
/// values.
pub fn run_block(
    w: &dyn WeightSource,
    id: BlockId,
    x: &mut [f32],
    inp: &BlockInputs<'_>,
    kv: &CrossKv,
) -> Result<(), RunError> {
    let cfg = w.config();
    let d = cfg.inner_dim();
    let eps = cfg.eps as f32;
    let pre = id.prefix();
    let table = w.tensor(&format!("{pre}.scale_shift_table"))?;
    // Modulation m_k = table[k] + timestep_proj[k], k = 0 shift, 1 scale, 2 gate (self-attn),
    // 3 shift, 4 scale, 5 gate (FFN).
    let modulation = |r: usize, k: usize| {
        let t = &inp.timestep_proj[inp.time_row(r) * 6 * d + k * d..][..d];
        let tab = &table[k * d..(k + 1) * d];
        (tab, t)
    };

    // 1. Self-attention.
    let mut y = x.to_vec();
    modulated_norm(&mut y, d, eps, |r| (modulation(r, 0), modulation(r, 1)));
    let attn = self_attention(w, &pre, &y, inp)?;
    let o = apply_linear(w, &format!("{pre}.attn1.to_out.0"), &attn, rows(inp), d, d)?;
    gated_residual(x, &o, d, |r| modulation(r, 2));

    // 2. Cross-attention, no gate.
    let mut n = x.to_vec();
    if cfg.cross_attn_norm {
        let g = w.tensor(&format!("{pre}.norm2.weight"))?;
        let b = w.tensor(&format!("{pre}.norm2.bias"))?;
        layer_norm(&mut n, d, eps, Some((&g, &b)));
    }
    let o = cross_attention(w, &pre, &n, inp, kv)?;
    for (xv, ov) in x.iter_mut().zip(&o) {
        *xv += ov;
    }

    // 3. Feed-forward.
    let mut y = x.to_vec();
    modulated_norm(&mut y, d, eps, |r| (modulation(r, 3), modulation(r, 4)));
    let f = feed_forward(w, &pre, &y, rows(inp), d, cfg.ffn_dim)?;
    gated_residual(x, &f, d, |r| modulation(r, 5));
    Ok(())
}

fn rows(inp: &BlockInputs<'_>) -> usize {
    inp.batch * inp.tokens
}

type TableAndProj<'t> = (&'t [f32], &'t [f32]);

/// `y = LN(x) · (1 + scale) + shift` per row, where scale and shift are table + proj rows.
pub fn modulated_norm<'t>(
    y: &mut [f32],
    d: usize,
    eps: f32,
    shift_scale: impl Fn(usize) -> (TableAndProj<'t>, TableAndProj<'t>) + Sync,
) {
    for_each_row(y, d, |r, row| {
        layer_norm_row(row, eps, None);
        let ((sh_tab, sh_t), (sc_tab, sc_t)) = shift_scale(r);
        for j in 0..d {
            let scale = sc_tab[j] + sc_t[j];
            let shift = sh_tab[j] + sh_t[j];
            row[j] = row[j] * (1.0 + scale) + shift;
        }
    });
}

/// `x = x + o · gate` per row, gate = table + proj row.
fn gated_residual<'t>(
    x: &mut [f32],
    o: &[f32],
    d: usize,
    gate: impl Fn(usize) -> TableAndProj<'t> + Sync,
) {
    for_each_row(x, d, |r, row| {
        let (g_tab, g_t) = gate(r);
        let o_row = &o[r * d..(r + 1) * d];
        for j in 0..d {
            row[j] += o_row[j] * (g_tab[j] + g_t[j]);
        }
    });
}

/// Projections, q/k RMSNorm over D, RoPE on q and k, SDPA. Returns (B·S, D) before to_out.
fn self_attention(
    w: &dyn WeightSource,
    pre: &str,
    y: &[f32],
    inp: &BlockInputs<'_>,
) -> Result<Vec<f32>, RunError> {
    let cfg = w.config();
    let (d, eps) = (cfg.inner_dim(), cfg.eps as f32);
    let (heads, dh) = (cfg.num_attention_heads, cfg.attention_head_dim);
    let m = rows(inp);
    let a = format!("{pre}.attn1");
    let mut q = apply_linear(w, &format!("{a}.to_q"), y, m, d, d)?;
    let mut k = apply_linear(w, &format!("{a}.to_k"), y, m, d, d)?;
    let v = apply_linear(w, &format!("{a}.to_v"), y, m, d, d)?;
    rms_norm(&mut q, d, eps, &w.tensor(&format!("{a}.norm_q.weight"))?);
    rms_norm(&mut k, d, eps, &w.tensor(&format!("{a}.norm_k.weight"))?);
    let half = dh / 2;
    let rope = |r: usize, row: &mut [f32]| {
        let s = r % inp.tokens;
        let (cos, sin) = (
            &inp.rope_cos[s * half..(s + 1) * half],
            &inp.rope_sin[s * half..(s + 1) * half],
        );
        for head in row.chunks_mut(dh) {
            rotate_pairs(head, cos, sin);
        }
    };
    for_each_row(&mut q, d, rope);
    for_each_row(&mut k, d, rope);
    let shape = AttentionShape {
        batch: inp.batch,
        queries: inp.tokens,
        keys: inp.tokens,
        heads,
        head_dim: dh,
    };
    Ok(attention(&q, &k, &v, shape))
}

/// Cross-attention of n (B·S, D) to the text keys/values, plus the image branch when
/// present (`a_txt + a_img`, one shared q); returns to_out applied to the sum.
fn cross_attention(
    w: &dyn WeightSource,
    pre: &str,
    n: &[f32],
    inp: &BlockInputs<'_>,
    kv: &CrossKv,
) -> Result<Vec<f32>, RunError> {
    let cfg = w.config();
    let (d, eps) = (cfg.inner_dim(), cfg.eps as f32);
    let (heads, dh) = (cfg.num_attention_heads, cfg.attention_head_dim);
    let m = rows(inp);
    let a = format!("{pre}.attn2");
    let mut q = apply_linear(w, &format!("{a}.to_q"), n, m, d, d)?;
    rms_norm(&mut q, d, eps, &w.tensor(&format!("{a}.norm_q.weight"))?);
    let shape = |keys| AttentionShape {
        batch: inp.batch,
        queries: inp.tokens,
        keys,
        heads,
        head_dim: dh,
    };
    let mut out = attention(&q, &kv.text.k, &kv.text.v, shape(kv.text.len));
    if let Some(img) = &kv.image {
        let out_img = attention(&q, &img.k, &img.v, shape(img.len));
        for (o, i) in out.iter_mut().zip(&out_img) {
            *o += i;
        }
    }
    apply_linear(w, &format!("{a}.to_out.0"), &out, m, d, d)
}

/// `ffn.net.2(GELU_tanh(ffn.net.0.proj(y)))`, in row chunks of [`FFN_ROWS`].
fn feed_forward(
    w: &dyn WeightSource,
    pre: &str,
    y: &[f32],
    m: usize,
    d: usize,
    ffn: usize,
) -> Result<Vec<f32>, RunError> {
    let w1 = w.tensor(&format!("{pre}.ffn.net.0.proj.weight"))?;
    let b1 = w.tensor(&format!("{pre}.ffn.net.0.proj.bias"))?;
    let w2 = w.tensor(&format!("{pre}.ffn.net.2.weight"))?;
    let b2 = w.tensor(&format!("{pre}.ffn.net.2.bias"))?;
    let mut out = Vec::with_capacity(m * d);
    for chunk in y.chunks(FFN_ROWS * d) {
        let r = chunk.len() / d;
        let mut h = linear(chunk, r, d, &w1, Some(&b1), ffn);
        map_inplace(&mut h, gelu_tanh);
        out.extend_from_slice(&linear(&h, r, ffn, &w2, Some(&b2), d));
    }
    Ok(out)
}
