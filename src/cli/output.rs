//! Value parsers shared by the flags of every producing command, so a flag means the same
//! thing everywhere: `--shard-size` takes "5GB", "500MB", "10GiB" or plain bytes on every
//! command; enumerated flags (`--dtype`, `--layout`, `--dora-strength`) are checked by clap
//! against lists derived from the library's own names, and listed in `--help`.

use clap::builder::PossibleValuesParser;
use wanbake::io::DType;
use wanbake::model::wan_layout::Layout;

/// `--shard-size`: decimal (KB, MB, GB) or binary (KiB, MiB, GiB) units, or bytes.
pub fn size(s: &str) -> Result<u64, String> {
    wanbake::recipe::parse_size(s)
}

/// `--dtype` of commands that can keep stored dtypes (`merge`, `restack`).
pub fn output_dtypes() -> PossibleValuesParser {
    PossibleValuesParser::new(["keep", "bf16", "f16", "f32"])
}

/// A WAN layout (`--layout`, `--to`, `--from`).
pub fn layouts() -> PossibleValuesParser {
    PossibleValuesParser::new(Layout::ALL.map(Layout::as_str))
}

/// `--dora-strength`.
pub fn dora_strengths() -> PossibleValuesParser {
    PossibleValuesParser::new(["merge", "peft"])
}

/// A float storage dtype (`convert`, `synth`): f32, f16 or bf16, any case, with the
/// PyTorch spellings (float32, float16, fp16, bfloat16).
pub fn float_dtype(s: &str) -> Result<DType, String> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "f16" | "float16" | "fp16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        other => Err(format!(
            "unknown dtype `{other}` (expected f32, f16 or bf16)"
        )),
    }
}
