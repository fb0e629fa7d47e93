"""Checks the Qwix LoRA naming and layout facts behind golden/qwix/ against the real libraries.

Not run by golden/generate.py. It needs jax, flax and qwix, which the project's Python
environment does not have. To run it:

    python3 -m venv /tmp/qwixenv && /tmp/qwixenv/bin/pip install "jax[cpu]" flax qwix
    /tmp/qwixenv/bin/python golden/qwix/probe_qwix.py

Last run: jax 0.10.2, flax 0.12.8, qwix 0.1.8. Output is recorded in golden/qwix/README.md.
It builds the tiny WAN block structure with MaxDiffusion's NNX module names. Only the Dense
layers matter here; norms and attention math are left out.
"""

import warnings

warnings.filterwarnings("ignore")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import qwix  # noqa: E402
from flax import nnx  # noqa: E402

D, FFN, L, PROJ_OUT, RANK, ALPHA = 32, 80, 3, 16, 4, 6.0


class Attention(nnx.Module):
    def __init__(self, rngs):
        self.query = nnx.Linear(D, D, rngs=rngs)
        self.key = nnx.Linear(D, D, rngs=rngs)
        self.value = nnx.Linear(D, D, rngs=rngs)
        self.proj_attn = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return self.proj_attn(self.query(x) + self.key(x) + self.value(x))


class GeluProj(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(D, FFN, rngs=rngs)

    def __call__(self, x):
        return jax.nn.gelu(self.proj(x))


class FeedForward(nnx.Module):
    def __init__(self, rngs):
        self.act_fn = GeluProj(rngs)
        self.proj_out = nnx.Linear(FFN, D, rngs=rngs)

    def __call__(self, x):
        return self.proj_out(self.act_fn(x))


class Block(nnx.Module):
    def __init__(self, rngs):
        self.attn1 = Attention(rngs)
        self.ffn = FeedForward(rngs)

    def __call__(self, x):
        x = x + self.attn1(x)
        return x + self.ffn(x)


class PerLayerModel(nnx.Module):
    """scan_layers=False: blocks is a list, so paths are blocks.<i>.…"""

    def __init__(self, rngs):
        self.blocks = nnx.List([Block(rngs) for _ in range(L)])
        self.proj_out = nnx.Linear(D, PROJ_OUT, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.proj_out(x)


def scanned_forward(blocks, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def body(carry, block):
        return block(carry)

    return body(x, blocks)


class ScannedModel(nnx.Module):
    """scan_layers=True as in MaxDiffusion: one Block built under nnx.vmap (leading axis L)."""

    def __init__(self, rngs, provider=None):
        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            block = Block(rngs)
            if provider is not None:  # LoRA added to each block inside the vmap
                block = qwix.apply_lora_to_model(block, provider, jnp.ones((1, D)), rngs=rngs)
            return block

        self.blocks = make(rngs)
        self.proj_out = nnx.Linear(D, PROJ_OUT, rngs=rngs)

    def __call__(self, x):
        return self.proj_out(scanned_forward(self.blocks, x))


def lora_paths(model):
    flat = nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    return [(".".join(str(p) for p in path), tuple(v.get_value().shape)) for path, v in flat]


def main():
    provider = qwix.LoraProvider(module_path=".*", rank=RANK, alpha=ALPHA)
    x = jnp.ones((1, D))

    print("1. unscanned model, qwix.apply_lora_to_model on the whole model")
    model = qwix.apply_lora_to_model(PerLayerModel(nnx.Rngs(0)), provider, x, rngs=nnx.Rngs(1))
    for path, shape in lora_paths(model):
        print(f"   {path} {shape}")

    print("2. scanned model, qwix.apply_lora_to_model on the whole model (params created in nnx.scan)")
    try:
        qwix.apply_lora_to_model(ScannedModel(nnx.Rngs(0)), provider, x, rngs=nnx.Rngs(1))
        print("   ok")
    except Exception as error:  # report, do not hide
        print(f"   FAILS: {type(error).__name__}: {error}")

    print("3. scanned model, LoRA applied to each block inside the nnx.vmap that stacks them")
    model = ScannedModel(nnx.Rngs(0), provider)
    for path, shape in lora_paths(model):
        print(f"   {path} {shape}")
    print(f"   scanned forward runs: output {model(jnp.ones((2, D))).shape}")

    print("4. forward delta on one Dense layer: y = x·W + bias + (alpha/rank)·x·a·b")
    layer = qwix.apply_lora_to_model(nnx.Linear(D, FFN, rngs=nnx.Rngs(3)), provider, x, rngs=nnx.Rngs(4))
    rng = np.random.default_rng(0)
    layer.kernel_lora_b.set_value(jnp.asarray(rng.standard_normal((RANK, FFN)), jnp.float32))
    inputs = rng.standard_normal((5, D)).astype(np.float32)
    a = np.asarray(layer.kernel_lora_a.get_value(), np.float64)
    b = np.asarray(layer.kernel_lora_b.get_value(), np.float64)
    kernel = np.asarray(layer.kernel.get_value(), np.float64)
    bias = np.asarray(layer.bias.get_value(), np.float64)
    expected = inputs.astype(np.float64) @ (kernel + ALPHA / RANK * a @ b) + bias
    error = np.abs(np.asarray(layer(jnp.asarray(inputs)), np.float64) - expected).max()
    print(f"   kernel {kernel.shape}, a {a.shape}, b {b.shape}, max |qwix − x(W+(α/r)ab)+bias| = {error:.2e}")
    print(f"   lora param dtype: {layer.kernel_lora_a.get_value().dtype} (base kernel {layer.kernel.get_value().dtype})")


if __name__ == "__main__":
    main()
