"""A whole diffusers WanPipeline folder, and the proof that wanbake's outputs of it load.

Two steps (pinned versions: golden/requirements.txt; diffusers 0.42.1):

    /tmp/d42-venv/bin/python golden/pipeline_folder_golden.py build
        Writes golden/pipeline/wan_t2v/: the smallest real WanPipeline diffusers can save,
        with `WanPipeline.save_pretrained`:
          transformer/   golden/models/t2v (the tiny WanTransformer3DModel the merge cases use)
          vae/           a tiny AutoencoderKLWan (seeded)
          text_encoder/  a tiny UMT5EncoderModel (seeded; d_model = the transformer's text_dim)
          tokenizer/     a tiny word-level tokenizer built here (no download), saved as the
                         PreTrainedTokenizerFast transformers wraps it in
          scheduler/     UniPCMultistepScheduler with flow_shift 3.0 (as Wan-AI's
                         Wan2.1-T2V-*-Diffusers repos ship it)
        plus a model card README.md at the root (a file of no component: wanbake carries it).
        The folder stays far below 1 MB.

    /tmp/d42-venv/bin/python golden/pipeline_folder_golden.py check --wanbake target/release/wanbake
        Runs the real binary on that folder (in a temporary directory) and loads every output
        with `WanPipeline.from_pretrained`:
          merge   --base golden/pipeline/wan_t2v
                  --adapter golden/adapters/diffusers_lora/pytorch_lora_weights.safetensors
          convert golden/pipeline/wan_t2v --dtype bf16
        For each output, every component but the transformer must hold exactly the input's
        tensors (state_dict equal, bit for bit), the tokenizer must encode a sentence to the
        same ids and the scheduler's config must be the input's; the merged transformer must
        equal diffusers' own `load_lora_weights` + `fuse_lora` on the input pipeline (max
        |difference| recorded), the converted one the input's transformer cast to bf16 by
        torch. The outcome is written to golden/pipeline/manifest.json (a record of this run;
        CI never runs Python: tests/pipeline_folder.rs checks the output folder itself).

    ... check --wanbake target/release/wanbake --wan-repo CHECKOUT
        Also checks that the `wan` and `nnx` layouts' outputs say what they are (issue 33), with
        original Wan's own model code from a checkout of Wan-Video/Wan2.1 (not vendored:
        `git clone https://github.com/Wan-Video/Wan2.1 && git -C Wan2.1 checkout 9737cba`):
          restack golden/models/t2v --to wan: `WanModel.load_config(OUT)` is the config, a
              `WanModel` built from it (with text_dim 24: `text_dim` is one of WanModel's
              `ignore_for_config` arguments, 4096 in every released model) loads
              OUT/diffusion_pytorch_model.safetensors with strict=True, and its state dict
              equals golden/models/t2v_original.safetensors (the original names, proved
              against diffusers' own converter by wan_golden.py); diffusers'
              `WanTransformer3DModel.from_pretrained(OUT)` fails;
          restack golden/models/t2v --to nnx-scanned: `WanTransformer3DModel.from_pretrained`
              and `DiffusionPipeline.load_config`-based loaders find no diffusers model there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import diffusers
import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

GOLDEN = Path(__file__).resolve().parent
REPO = GOLDEN.parent
PIPELINE = GOLDEN / "pipeline" / "wan_t2v"
MANIFEST = GOLDEN / "pipeline" / "manifest.json"
TRANSFORMER = GOLDEN / "models" / "t2v"
LORA = GOLDEN / "adapters" / "diffusers_lora" / "pytorch_lora_weights.safetensors"

SIZE_BUDGET_BYTES = 1024 * 1024
SENTENCE = "a cat walks on the grass"

VERSIONS = {
    "torch": torch.__version__.split("+")[0],
    "diffusers": diffusers.__version__,
    "transformers": transformers.__version__,
    "tokenizers": tokenizers.__version__,
    "safetensors": safetensors.__version__,
}

README = """---
license: apache-2.0
---
# wanbake test pipeline

A tiny WanPipeline (random weights) made by golden/pipeline_folder_golden.py. Not a model.
"""


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a few words, with T5's special tokens (no download)."""
    words = ["<pad>", "</s>", "<unk>"] + "a cat dog walks runs on the grass snow".split()
    vocab = {w: i for i, w in enumerate(words)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def tiny_vae() -> AutoencoderKLWan:
    torch.manual_seed(2001)
    z = 4
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=z,
        dim_mult=[1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False],
        latents_mean=[0.0] * z,
        latents_std=[1.0] * z,
    )


def tiny_text_encoder(d_model: int) -> UMT5EncoderModel:
    torch.manual_seed(2002)
    config = UMT5Config(
        vocab_size=16,
        d_model=d_model,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    return UMT5EncoderModel(config)


def build() -> None:
    transformer = WanTransformer3DModel.from_pretrained(TRANSFORMER)
    pipe = WanPipeline(
        tokenizer=tiny_tokenizer(),
        text_encoder=tiny_text_encoder(transformer.config.text_dim),
        vae=tiny_vae(),
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
        transformer=transformer,
    )
    if PIPELINE.exists():
        shutil.rmtree(PIPELINE)
    pipe.save_pretrained(PIPELINE)
    (PIPELINE / "README.md").write_text(README)
    total = sum(p.stat().st_size for p in PIPELINE.rglob("*") if p.is_file())
    assert total < SIZE_BUDGET_BYTES, f"the pipeline folder is {total} bytes"
    files = sorted(str(p.relative_to(PIPELINE)) for p in PIPELINE.rglob("*") if p.is_file())
    print(f"wrote {PIPELINE.relative_to(REPO)}: {len(files)} files, {total} bytes")
    for f in files:
        print("  ", f)


def load(path: Path) -> WanPipeline:
    pipe = WanPipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def same_module(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa
    )


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def untouched_components(inp: WanPipeline, out: WanPipeline) -> dict:
    """Every component but the transformer as loaded from the output, against the input's."""
    ids = lambda p: p.tokenizer(SENTENCE).input_ids
    result = {
        "vae": same_module(inp.vae, out.vae),
        "text_encoder": same_module(inp.text_encoder, out.text_encoder),
        "tokenizer": ids(inp) == ids(out) and type(inp.tokenizer) is type(out.tokenizer),
        "scheduler": dict(inp.scheduler.config) == dict(out.scheduler.config)
        and type(inp.scheduler) is type(out.scheduler),
    }
    assert all(result.values()), result
    return result


def wanbake(binary: Path, *args: str) -> None:
    cmd = [str(binary), *args, "--quiet"]
    subprocess.run(cmd, check=True, cwd=REPO)


def original_wan_model(wan_repo: Path):
    """`WanModel` of a Wan-Video/Wan2.1 checkout, imported as a package of its own."""
    import importlib.util
    import types

    modules = wan_repo / "wan" / "modules"
    pkg = types.ModuleType("wan21_modules")
    pkg.__path__ = [str(modules)]
    sys.modules["wan21_modules"] = pkg
    spec = importlib.util.spec_from_file_location("wan21_modules.model", modules / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["wan21_modules.model"] = module
    spec.loader.exec_module(module)
    return module.WanModel


def diffusers_refuses(path: Path) -> str:
    try:
        WanTransformer3DModel.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any refusal is the expected outcome
        said = str(e).splitlines()[0].replace(str(path), "OUT")
        return f"{type(e).__name__}: {said[:160]}"
    raise AssertionError(f"diffusers loaded {path}")


def check_layouts(binary: Path, wan_repo: Path) -> dict:
    WanModel = original_wan_model(wan_repo)
    commit = subprocess.run(
        ["git", "-C", str(wan_repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        wan = Path(tmp) / "wan"
        wanbake(binary, "restack", str(TRANSFORMER), "--to", "wan", "--out", str(wan))
        config = WanModel.load_config(wan)
        init = {k: v for k, v in config.items() if not k.startswith("_")}
        model = WanModel(**init, text_dim=24)
        stored = safetensors.torch.load_file(wan / "diffusion_pytorch_model.safetensors")
        model.load_state_dict(stored, strict=True)
        ref = safetensors.torch.load_file(GOLDEN / "models" / "t2v_original.safetensors")
        state = model.state_dict()
        same = state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)
        assert same, "WanModel's state dict is not the original-named weights"
        out["wan"] = {
            "command": "wanbake restack golden/models/t2v --to wan --out OUT",
            "wan_repo": f"Wan-Video/Wan2.1@{commit}",
            "config": dict(config),
            "loads": "WanModel(**WanModel.load_config(OUT), text_dim=24).load_state_dict(strict=True)",
            "state_dict_equals_t2v_original": same,
            "diffusers_WanTransformer3DModel_from_pretrained": diffusers_refuses(wan),
        }
        nnx = Path(tmp) / "nnx"
        wanbake(binary, "restack", str(TRANSFORMER), "--to", "nnx-scanned", "--out", str(nnx))
        out["nnx_scanned"] = {
            "command": "wanbake restack golden/models/t2v --to nnx-scanned --out OUT",
            "files": sorted(p.name for p in nnx.iterdir()),
            "config_class_name": json.loads((nnx / "config.json").read_text()).get("_class_name"),
            "diffusers_WanTransformer3DModel_from_pretrained": diffusers_refuses(nnx),
        }
    return out


def check(binary: Path, wan_repo: Path | None = None) -> None:
    inp = load(PIPELINE)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        merged_dir = Path(tmp) / "merged"
        wanbake(binary, "merge", "--base", str(PIPELINE), "--adapter", str(LORA), "--out", str(merged_dir))
        out = load(merged_dir)
        ref = load(PIPELINE)
        ref.load_lora_weights(str(LORA.parent), weight_name=LORA.name)
        ref.fuse_lora(components=["transformer"], lora_scale=1.0)
        ref.unload_lora_weights()
        diff = max_diff(ref.transformer.state_dict(), out.transformer.state_dict())
        assert diff < 1e-6, diff
        results["merge"] = {
            "command": "wanbake merge --base golden/pipeline/wan_t2v --adapter "
            "golden/adapters/diffusers_lora/pytorch_lora_weights.safetensors --out OUT",
            "loads": "WanPipeline.from_pretrained(OUT)",
            "untouched_components_equal": untouched_components(inp, out),
            "transformer_vs_diffusers_fuse_lora_max_abs_diff": diff,
        }
        converted_dir = Path(tmp) / "bf16"
        wanbake(binary, "convert", str(PIPELINE), "--dtype", "bf16", "--out", str(converted_dir))
        out = load(converted_dir)
        # On disk every tensor is bf16 and equals torch's cast of the input's; loaded (in
        # from_pretrained's default float32) the module holds exactly those values.
        want = {k: v.to(torch.bfloat16) for k, v in inp.transformer.state_dict().items()}
        stored = safetensors.torch.load_file(converted_dir / "transformer" / "diffusion_pytorch_model.safetensors")
        got = out.transformer.state_dict()
        same = (
            want.keys() == got.keys() == stored.keys()
            and all(stored[k].dtype == torch.bfloat16 and torch.equal(want[k], stored[k]) for k in want)
            and all(torch.equal(want[k].to(got[k].dtype), got[k]) for k in want)
        )
        assert same, "the converted transformer is not the input's cast to bf16"
        results["convert_bf16"] = {
            "command": "wanbake convert golden/pipeline/wan_t2v --dtype bf16 --out OUT",
            "loads": "WanPipeline.from_pretrained(OUT)",
            "untouched_components_equal": untouched_components(inp, out),
            "transformer_equals_input_cast_to_bf16": same,
        }
    if wan_repo is not None:
        results["layouts"] = check_layouts(binary, wan_repo)
    files = sorted(str(p.relative_to(PIPELINE)) for p in PIPELINE.rglob("*") if p.is_file())
    record = {"versions": VERSIONS, "pipeline": "golden/pipeline/wan_t2v", "files": files, "runs": results}
    MANIFEST.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2, sort_keys=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("build")
    c = sub.add_parser("check")
    c.add_argument("--wanbake", type=Path, required=True)
    c.add_argument("--wan-repo", type=Path, help="a Wan-Video/Wan2.1 checkout (the layout checks)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.step == "build":
        build()
    else:
        check(a.wanbake.resolve(), a.wan_repo.resolve() if a.wan_repo else None)


if __name__ == "__main__":
    sys.exit(main())
