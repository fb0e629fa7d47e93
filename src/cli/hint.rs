//! What a front end adds to a library error: the `hint:` line that says what to do, in the
//! spelling of the front end that ran (a command's flags, or a recipe's keys for `bake`),
//! and whether the error is a mistake in how the command was called (exit code 2).
//!
//! Library errors say what is wrong and carry the facts (structured variants where the way
//! out depends on the case); they name no flag and no recipe key. This module walks the
//! error's chain, finds the library errors it knows, and words the way out for `front`:
//! `merge` says `--allow-unmatched`, `bake` says `allow_unmatched = true` in `[merge]`. A
//! flag is only suggested to a command that has it (asked of the clap definitions), so a
//! command without the flag gets no hint rather than a wrong one.

use std::error::Error;
use std::path::Path;

use clap::CommandFactory;
use wanbake::adapter::AdapterError;
use wanbake::bake::BakeError;
use wanbake::extract::ExtractError;
use wanbake::layout::restack::RestackError;
use wanbake::merge::{MergeError, MergeFailure};
use wanbake::model::plan_error::{PlanError, animate_note};
use wanbake::model::wan_layout::LAYOUT_FIELD;
use wanbake::pipeline::{Origin, PipelineError, UnheldValues};
use wanbake::quant::encode::QuantError;
use wanbake::recipe::RecipeError;
use wanbake::release::ReleaseError;
use wanbake::release::staging::WriteError;
use wanbake::runner::RunError;
use wanbake::signing::SignError;
use wanbake::translation::TranslateError;

use super::{Cli, Command, UsageError};

/// Which front end ran, so a hint can be spelled as the user can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontEnd {
    /// A command whose options are flags (`merge`, `convert`, ...): its clap name.
    Flags(&'static str),
    /// `bake` (and `bake --dry-run`): options are recipe keys.
    Recipe,
}

impl FrontEnd {
    /// The front end of `command`.
    pub fn of(command: &Command) -> FrontEnd {
        match command {
            Command::Bake(_) => FrontEnd::Recipe,
            Command::Inspect(_) => FrontEnd::Flags("inspect"),
            Command::Verify(_) => FrontEnd::Flags("verify"),
            Command::Synth(_) => FrontEnd::Flags("synth"),
            Command::Convert(_) => FrontEnd::Flags("convert"),
            Command::Translate(_) => FrontEnd::Flags("translate"),
            Command::Merge(_) => FrontEnd::Flags("merge"),
            Command::Restack(_) => FrontEnd::Flags("restack"),
            Command::Run(_) => FrontEnd::Flags("run"),
            Command::Sign(_) => FrontEnd::Flags("sign"),
            Command::Extract(_) => FrontEnd::Flags("extract"),
            Command::Resize(_) => FrontEnd::Flags("resize"),
            Command::Completions(_) => FrontEnd::Flags("completions"),
        }
    }

    /// Does this front end take `--long` (accepting `value`, when one is given)?
    fn has_flag(self, long: &str, value: Option<&str>) -> bool {
        match self {
            FrontEnd::Flags(name) => command_has_flag(&Cli::command(), name, long, value),
            FrontEnd::Recipe => false,
        }
    }
}

/// Does subcommand `name` of `cli` take `--long` (accepting `value`, when one is given)?
fn command_has_flag(cli: &clap::Command, name: &str, long: &str, value: Option<&str>) -> bool {
    let Some(command) = cli.find_subcommand(name) else {
        return false;
    };
    command.get_arguments().any(|a| {
        a.get_long() == Some(long)
            && value.is_none_or(|v| a.get_possible_values().iter().any(|p| p.matches(v, false)))
    })
}

/// A flag's value that cannot be used, and why (exit code 2): `--svd-cache: <cause>`.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}")]
pub struct FlagError {
    /// The flag, without its dashes.
    pub flag: &'static str,
    /// Why its value cannot be used.
    #[source]
    pub source: Box<dyn Error + Send + Sync>,
}

impl FlagError {
    /// `flag`'s value cannot be used because of `source`.
    pub fn new(flag: &'static str, source: impl Error + Send + Sync + 'static) -> FlagError {
        FlagError {
            flag,
            source: Box::new(source),
        }
    }
}

/// What `--json` prints when a command fails: `{"error": TEXT}` (the chain `main` prints),
/// with every key or entry of an adapter error whose message lists only the first few, and
/// its verdict (`AdapterError::listed`).
pub fn error_document(e: &anyhow::Error) -> serde_json::Value {
    let mut doc = serde_json::json!({
        "error": wanbake::error_text::Chain(e.as_ref()).to_string(),
    });
    let adapter = links(e)
        .into_iter()
        .find_map(|l| l.downcast_ref::<AdapterError>());
    if let (Some(serde_json::Value::Object(listed)), Some(d)) =
        (adapter.and_then(AdapterError::listed), doc.as_object_mut())
    {
        d.extend(listed);
    }
    doc
}

/// What `--to fp8-scaled` writes, for the hints that point at it.
const FP8_SCALED: &str = "ComfyUI's scaled fp8 (the dtype then names the tensors that stay \
    high precision)";

/// Does a dtype value ask for fp8 (`fp8`, `float8_e4m3fn`, `f8_e4m3`, ...)?
fn is_fp8(value: &str) -> bool {
    let v = value.to_ascii_lowercase();
    v.starts_with("fp8") || v.starts_with("float8") || v.starts_with("f8")
}

/// The hint for a command line clap refused, when there is one: `--dtype fp8` asks for
/// what `--to fp8-scaled` writes (said to a command that has it). `args` is the command
/// line without the program name.
pub fn parse_hint(e: &clap::Error, args: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != clap::error::ErrorKind::InvalidValue {
        return None;
    }
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.as_str(),
        _ => return None,
    };
    let value = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(s)) => s.as_str(),
        _ => return None,
    };
    let cli = Cli::command();
    // The subcommand: the first argument that names one.
    let command = args
        .iter()
        .find(|a| cli.find_subcommand(a.as_str()).is_some())?;
    let has_fp8 = command_has_flag(&cli, command, "to", Some("fp8-scaled"));
    (arg.starts_with("--dtype") && is_fp8(value) && has_fp8)
        .then(|| format!("fp8 is an encoding, not a dtype: --to fp8-scaled writes {FP8_SCALED}"))
}

/// The hint for `e` as `front` spells it: the first link of the chain that has one.
pub fn hint(e: &anyhow::Error, front: FrontEnd) -> Option<String> {
    links(e).into_iter().find_map(|link| hint_for(link, front))
}

/// Is `e` a mistake in how the command was called (exit code 2)? `UsageError`s and flag
/// values that cannot be used always are; so are, for a command with flags, the binding
/// and planning refusals its flags resolve (which transformer an adapter is for, an
/// integer tensor an adapter targets). In a recipe they are refusals of its values
/// (exit code 1, as every other recipe error), except a value that is not one of the
/// names its field takes: that is a usage error in both front ends.
pub fn is_usage(e: &anyhow::Error, front: FrontEnd) -> bool {
    links(e).into_iter().any(|link| {
        link.is::<UsageError>()
            || link.is::<FlagError>()
            || matches!(
                link.downcast_ref::<RecipeError>(),
                Some(RecipeError::UnknownValue { .. })
            )
            || (matches!(front, FrontEnd::Flags(_))
                && (matches!(
                    link.downcast_ref::<AdapterError>(),
                    Some(
                        AdapterError::ComponentNeeded { .. } | AdapterError::NoSuchComponent { .. }
                    )
                ) || matches!(
                    link.downcast_ref::<PipelineError>(),
                    Some(PipelineError::IntegerTarget { .. })
                )))
    })
}

/// Every error of the chain, outermost first, with the error each `#[error(transparent)]`
/// variant (or a `Box`) wraps said right after it: a transparent variant shows its inner
/// error's text and source, so the inner error itself is not a link of `e.chain()`.
fn links(e: &anyhow::Error) -> Vec<&(dyn Error + 'static)> {
    let mut out = Vec::new();
    for cause in e.chain() {
        let mut link: &(dyn Error + 'static) = cause;
        out.push(link);
        while let Some(inner) = transparent_inner(link) {
            out.push(inner);
            link = inner;
        }
    }
    out
}

/// The error a transparent variant of a library error wraps. (A new transparent variant
/// that can wrap an error with a hint is listed here, or its hint is not found.)
fn transparent_inner<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a (dyn Error + 'static)> {
    // A boxed source (`#[source] source: Box<WriteError>`) is a link of type `Box<_>`.
    if let Some(b) = e.downcast_ref::<Box<WriteError>>() {
        return Some(&**b);
    }
    if let Some(b) = e.downcast_ref::<Box<QuantError>>() {
        return Some(&**b);
    }
    if let Some(e) = e.downcast_ref::<BakeError>() {
        return match e {
            BakeError::Recipe(x) => Some(x),
            BakeError::Read(x) => Some(x),
            BakeError::Adapter(x) => Some(&**x),
            BakeError::Plan(x) => Some(&**x),
            BakeError::Write(x) => Some(&**x),
            BakeError::Sign(x) => Some(x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<ReleaseError>() {
        return match e {
            ReleaseError::Write(x) => Some(x),
            ReleaseError::Input(x) => Some(x),
            ReleaseError::Produce(x) => Some(&**x),
        };
    }
    if let Some(e) = e.downcast_ref::<MergeFailure>() {
        return match e {
            MergeFailure::Plan(x) => Some(&**x),
            MergeFailure::Write(x) => Some(&**x),
        };
    }
    if let Some(e) = e.downcast_ref::<MergeError>() {
        return match e {
            MergeError::Pipeline(x) => Some(x),
            MergeError::Svd(x) => Some(&**x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<PipelineError>() {
        return match e {
            PipelineError::Read(x) => Some(x),
            PipelineError::Encode(x) => Some(&**x),
            PipelineError::Unheld(x) => Some(&**x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<QuantError>() {
        return match e {
            QuantError::Read(x) => Some(x),
            QuantError::Layout(x) => Some(x),
            QuantError::Dtype(x) => Some(x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<ExtractError>() {
        return match e {
            ExtractError::Unheld(x) => Some(&**x),
            ExtractError::Read(x) => Some(x),
            ExtractError::Adapter(x) => Some(x),
            ExtractError::Write(x) => Some(x),
            ExtractError::Release(x) => Some(x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<TranslateError>() {
        return match e {
            TranslateError::Adapter(x) => Some(x),
            TranslateError::Read(x) => Some(x),
            TranslateError::Release(x) => Some(x),
        };
    }
    if let Some(e) = e.downcast_ref::<RestackError>() {
        return match e {
            RestackError::Read(x) => Some(x),
            RestackError::Release(x) => Some(x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<AdapterError>() {
        return match e {
            AdapterError::Read(x) => Some(x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<RunError>() {
        return match e {
            RunError::Read(x) => Some(x),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<SignError>() {
        return match e {
            SignError::Key(x) => Some(x),
            SignError::Read(x) => Some(x),
            SignError::Write(x) => Some(x),
            _ => None,
        };
    }
    None
}

/// The hint of one link, if it is an error this module knows.
fn hint_for(e: &(dyn Error + 'static), front: FrontEnd) -> Option<String> {
    if let Some(e) = e.downcast_ref::<AdapterError>() {
        return adapter_hint(e, front);
    }
    if let Some(e) = e.downcast_ref::<UnheldValues>() {
        return unheld_hint(e, front);
    }
    if let Some(e) = e.downcast_ref::<PipelineError>() {
        return match e {
            PipelineError::IntegerTarget { .. } => dtype_hint(front),
            PipelineError::Quantize { path, source } => quantize_hint(path, source, front),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<PlanError>() {
        return match e {
            PlanError::MixedDtypes { .. } => dtype_hint(front),
            PlanError::Ambiguous { .. }
            | PlanError::Undetectable {
                closest: Some(_), ..
            } => Some(layout_hint(front)),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<WriteError>() {
        return write_hint(e, front);
    }
    if let Some(e) = e.downcast_ref::<RunError>() {
        return run_hint(e, front);
    }
    if let Some(RecipeError::UnknownValue { field, value, .. }) = e.downcast_ref::<RecipeError>()
        && field == "output.dtype"
        && is_fp8(value)
    {
        return Some(format!(
            "fp8 is an encoding, not a dtype: set `to = \"fp8-scaled\"` in [output] for {FP8_SCALED}"
        ));
    }
    if let Some(ExtractError::Device { .. }) = e.downcast_ref::<ExtractError>() {
        return front
            .has_flag("device", Some("cpu"))
            .then(|| "--device cpu runs the SVDs on the CPU".into());
    }
    None
}

fn write_hint(e: &WriteError, front: FrontEnd) -> Option<String> {
    match e {
        WriteError::Exists { .. } => Some(match front {
            FrontEnd::Recipe => {
                "set `overwrite = true` in [output] to replace it, or choose another output.dir"
                    .into()
            }
            _ if front.has_flag("overwrite", None) => {
                "choose another output path or pass --overwrite".into()
            }
            _ => "choose another output path".into(),
        }),
        WriteError::Io { source, .. } => {
            let code = source.raw_os_error()?;
            if code == libc::ENOSPC {
                Some("the disk is full: free space or choose another output location".into())
            } else if code == libc::EFBIG {
                Some("file size limit reached: check `ulimit -f`".into())
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Which transformer an adapter is for, unmatched keys and entries, a convention to choose,
/// names to resolve.
fn adapter_hint(e: &AdapterError, front: FrontEnd) -> Option<String> {
    let recipe = front == FrontEnd::Recipe;
    match e {
        AdapterError::ComponentNeeded {
            adapter,
            components,
        } => Some(if recipe {
            format!(
                "give its [[adapter]] an expert: {}",
                or_list(components.iter().map(|c| format!("`expert = \"{c}\"`")))
            )
        } else {
            let first = components.first().map_or("transformer", String::as_str);
            format!("say it as --adapter {first}={adapter}, or all={adapter} for every one")
        }),
        AdapterError::NoSuchComponent {
            named, components, ..
        } => Some(match (recipe, components.as_slice()) {
            (true, [_]) => format!("remove `expert = \"{named}\"` from its [[adapter]]"),
            (false, [_]) => format!("drop the prefix `{named}=`"),
            (true, _) => format!(
                "set its expert to one of the base's: {}",
                or_list(components.iter().map(|c| format!("`expert = \"{c}\"`")))
            ),
            (false, _) => format!(
                "prefix it with one of the base's transformers: {}, or all= for every one",
                components
                    .iter()
                    .map(|c| format!("{c}="))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
        AdapterError::Keys { .. } | AdapterError::Unmatched { .. } => {
            if recipe {
                Some("set `allow_unmatched = true` in [merge] to skip them knowingly".into())
            } else {
                front
                    .has_flag("allow-unmatched", None)
                    .then(|| "pass --allow-unmatched to skip them knowingly".into())
            }
        }
        AdapterError::Mixed { .. } => {
            if recipe {
                Some(
                    "set `from = \"<convention>\"` on its [[adapter]] to read it as one of them"
                        .into(),
                )
            } else {
                front
                    .has_flag("from", Some("comfy"))
                    .then(|| "pass --from <convention> to read it as one of them".into())
            }
        }
        AdapterError::ScaleNeeded { .. } => {
            let s = "S = your LoRA rule's alpha / rank";
            if recipe {
                Some(format!("set `scale = S` on its [[adapter]] ({s})"))
            } else if front.has_flag("scale", None) {
                Some(format!("pass it explicitly with --scale S ({s})"))
            } else {
                Some(format!(
                    "give it as `scale = S` on the [[adapter]] of a `wanbake bake` recipe, or \
                     translate the adapter first: `wanbake translate ADAPTER --to peft --scale S \
                     --out DIR` ({s})"
                ))
            }
        }
        AdapterError::Names { .. } => front
            .has_flag("base", None)
            .then(|| "pass --base BASE so names are matched against the base's own keys".into()),
        _ => None,
    }
}

/// Values the output cannot hold: what removes the cause (a wider dtype or format for an
/// overflow, a lower strength for a merge that made them, repairing the input that holds
/// them), then the way to write them anyway (`--allow-nonfinite`, or `allow_nonfinite` in
/// a recipe's [output]).
fn unheld_hint(e: &UnheldValues, front: FrontEnd) -> Option<String> {
    let recipe = front == FrontEnd::Recipe;
    let mut ways = Vec::new();
    if let Origin::Merge { adapter, strength } = &e.origin {
        ways.push(if recipe {
            format!(
                "lower the strength of {} (now {strength})",
                adapter.display()
            )
        } else {
            format!(
                "lower the strength of --adapter {} (now {strength})",
                adapter.display()
            )
        });
    }
    if let Origin::Merged { .. } = e.origin {
        ways.push("lower the adapters' strengths".to_string());
    }
    if e.overflow() {
        let quantized = e.dtype.is_none() || e.into.starts_with("GGUF");
        let wider = match e.dtype {
            Some(wanbake::io::DType::F16) => Some("bf16"),
            Some(wanbake::io::DType::BF16) => Some("f32"),
            _ => None,
        };
        match (quantized, wider) {
            (false, Some(d)) if recipe => {
                ways.push(format!("set `dtype = \"{d}\"` in [output], which holds it"))
            }
            (false, Some(d)) if front.has_flag("dtype", Some(d)) => {
                ways.push(format!("write --dtype {d}, which holds it"))
            }
            (true, _) if recipe => ways.push(
                "set `to = \"fp8-scaled\"` (a per-tensor scale) or `to = \"gguf:bf16\"` in \
                 [output], which hold it"
                    .into(),
            ),
            (true, _) if front.has_flag("to", Some("fp8-scaled")) => ways.push(
                "write --to fp8-scaled (a per-tensor scale) or --to gguf:bf16, which hold it"
                    .into(),
            ),
            _ => {}
        }
    } else {
        match e.origin {
            Origin::Base => ways.push(format!(
                "{} itself holds it: re-export or re-download it",
                e.file.display()
            )),
            Origin::Adapter => ways.push(format!(
                "{} itself holds it: re-export it, or leave the adapter out",
                e.file.display()
            )),
            _ => {}
        }
    }
    let allow = "to write them as the output rounds them, listed in the manifest's report";
    if recipe {
        ways.push(format!("set `allow_nonfinite = true` in [output] {allow}"));
    } else if front.has_flag("allow-nonfinite", None) {
        ways.push(format!("pass --allow-nonfinite {allow}"));
    }
    (!ways.is_empty()).then(|| ways.join("; or "))
}

/// A model the runner cannot configure: a boundary ratio to give (`--boundary-ratio`, or
/// `boundary_ratio` in a recipe's [[check]]), a config to give (`--config`, or a
/// config.json beside the weights, which is all a recipe's checks read).
fn run_hint(e: &RunError, front: FrontEnd) -> Option<String> {
    let recipe = front == FrontEnd::Recipe;
    match e {
        RunError::NoBoundaryRatio if recipe => Some("set `boundary_ratio` in the [[check]]".into()),
        RunError::NoBoundaryRatio => front
            .has_flag("boundary-ratio", None)
            .then(|| "pass --boundary-ratio".into()),
        RunError::UnknownConfig { quantized, .. } => {
            let flag = front.has_flag("config", None);
            match (quantized, flag) {
                (true, true) => Some("pass --config".into()),
                (true, false) if recipe => {
                    Some("put the base's config.json beside its weights".into())
                }
                (true, false) => None,
                (false, true) => {
                    Some("put the model's config.json beside the weights or pass --config".into())
                }
                (false, false) => Some("put the model's config.json beside the weights".into()),
            }
        }
        _ => None,
    }
}

/// A base a quantized output cannot be made of: one transformer folder of a pipeline, or
/// the base restacked to the original-Wan layout first.
fn quantize_hint(base: &Path, e: &QuantError, front: FrontEnd) -> Option<String> {
    let recipe = front == FrontEnd::Recipe;
    let restack = |from: &str| {
        let command = format!("`wanbake restack IN{from} --to wan --out DIR`");
        if recipe {
            format!("restack the base first ({command}) and set [base] path to the result")
        } else {
            format!("{command} first")
        }
    };
    match e {
        QuantError::Transformers { components, .. } => {
            let first = components.first().map_or("transformer", String::as_str);
            let folder = base.join(first);
            Some(if recipe {
                format!(
                    "set [base] path to one transformer folder, e.g. {}",
                    folder.display()
                )
            } else {
                format!("pass one transformer folder, e.g. {}", folder.display())
            })
        }
        QuantError::UnreadLayout { .. } => Some(restack("")),
        QuantError::Layout(PlanError::Undetectable { unknown, .. })
            if !animate_note(unknown).is_empty() =>
        {
            None
        }
        QuantError::Layout(
            PlanError::Ambiguous { .. }
            | PlanError::Undetectable {
                closest: Some(_), ..
            },
        ) => Some(restack(" --from <layout>")),
        _ => None,
    }
}

/// An output dtype that holds every value: `--dtype bf16, f16 or f32`, or `dtype` in
/// `[output]`.
fn dtype_hint(front: FrontEnd) -> Option<String> {
    if front == FrontEnd::Recipe {
        Some("set `dtype = \"bf16\"` (or \"f16\", \"f32\") in [output]".into())
    } else {
        front
            .has_flag("dtype", Some("bf16"))
            .then(|| "choose --dtype bf16, f16 or f32".into())
    }
}

/// How to name the input's layout: `--from` where the command takes one (`restack`), else
/// the config.json field every reader honours (a recipe has no layout key).
fn layout_hint(front: FrontEnd) -> String {
    if front.has_flag("from", Some("nnx-scanned")) {
        "pass --from <layout> to choose one".into()
    } else {
        format!(
            "name the layout in the config.json next to the weights (`\"{}\": \"wan\"`, ...)",
            LAYOUT_FIELD
        )
    }
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wanbake::model::wan_layout::Layout;

    const MERGE: FrontEnd = FrontEnd::Flags("merge");
    const RESTACK: FrontEnd = FrontEnd::Flags("restack");

    #[test]
    fn flags_are_read_from_the_clap_definitions() {
        assert!(MERGE.has_flag("allow-unmatched", None));
        assert!(!FrontEnd::Flags("translate").has_flag("allow-unmatched", None));
        // `--from` is a convention for translate and a layout for restack.
        assert!(FrontEnd::Flags("translate").has_flag("from", Some("comfy")));
        assert!(!FrontEnd::Flags("translate").has_flag("from", Some("nnx-scanned")));
        assert!(RESTACK.has_flag("from", Some("nnx-scanned")));
        assert!(!MERGE.has_flag("from", None));
        assert!(!FrontEnd::Recipe.has_flag("overwrite", None));
    }

    #[test]
    fn a_layout_is_named_by_flag_where_there_is_one_else_in_config_json() {
        let ambiguous = || PlanError::Ambiguous {
            candidates: vec![Layout::Nnx, Layout::NnxScanned],
        };
        // Wrapped as the pipeline wraps it: the hint is found below the first link.
        let e = || {
            anyhow::Error::from(PipelineError::Layout {
                component: String::new(),
                source: ambiguous(),
            })
        };
        assert_eq!(
            hint(&e(), RESTACK).as_deref(),
            Some("pass --from <layout> to choose one")
        );
        for front in [MERGE, FrontEnd::Recipe] {
            assert!(
                hint(&e(), front)
                    .unwrap()
                    .contains("`\"_wanbake_layout\": \"wan\"`")
            );
        }
    }

    #[test]
    fn a_hint_behind_a_transparent_variant_is_found() {
        let exists = || WriteError::Exists { path: "out".into() };
        let e = anyhow::Error::from(BakeError::from(ReleaseError::from(exists())));
        assert_eq!(
            hint(&e, FrontEnd::Recipe).as_deref(),
            Some("set `overwrite = true` in [output] to replace it, or choose another output.dir")
        );
        let e = anyhow::Error::from(ExtractError::from(exists()));
        assert_eq!(
            hint(&e, FrontEnd::Flags("extract")).as_deref(),
            Some("choose another output path or pass --overwrite")
        );
        assert_eq!(
            hint(&anyhow::Error::from(exists()), FrontEnd::Flags("sign")).as_deref(),
            Some("choose another output path")
        );
    }

    #[test]
    fn component_refusals_are_usage_errors_of_flags_only() {
        let e = || {
            anyhow::Error::from(BakeError::from(AdapterError::ComponentNeeded {
                adapter: "a.safetensors".into(),
                components: vec!["transformer".into(), "transformer_2".into()],
            }))
        };
        assert!(is_usage(&e(), MERGE));
        assert!(!is_usage(&e(), FrontEnd::Recipe));
        assert_eq!(
            hint(&e(), FrontEnd::Recipe).as_deref(),
            Some(
                "give its [[adapter]] an expert: `expert = \"transformer\"` or \
                 `expert = \"transformer_2\"`"
            )
        );
        assert_eq!(
            hint(&e(), MERGE).as_deref(),
            Some(
                "say it as --adapter transformer=a.safetensors, or all=a.safetensors for every one"
            )
        );
    }

    #[test]
    fn or_lists_read_as_english() {
        let l = |v: &[&str]| or_list(v.iter().map(|s| s.to_string()));
        assert_eq!(l(&[]), "");
        assert_eq!(l(&["a"]), "a");
        assert_eq!(l(&["a", "b"]), "a or b");
        assert_eq!(l(&["a", "b", "c"]), "a, b or c");
    }
}
