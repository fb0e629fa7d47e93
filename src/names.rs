//! The spelling tables of enumerated options. Every type that the command line, recipes or
//! reports spell by name (`Layout`, `OutputDType`, `DoraStrength`, `Convention`,
//! `adapter::Kind`, `QuantFormat`, `OutputFormat`, `DeviceChoice`, `TruncMethod`, `synth::Fill`,
//! `synth::SynthModel`) lists its values once (`ALL`) and spells each once (`as_str`). Its
//! `FromStr`, its `Display`, its serde name, the messages that list the accepted names, and
//! the `clap::ValueEnum` that `value_enum!` derives read that one table (or are tested
//! against it), so the parser, `--help`, recipes and manifests cannot disagree. Names are
//! case-sensitive everywhere (clap's default).
//!
//! Does not own: the command line (`src/cli`, part of the binary), or what each command
//! accepts of a table (a command that takes a subset says so there).

/// `a, b, c or d`: a table's names for a message.
pub fn either<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The value of `all` spelt `s`.
pub(crate) fn find<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str, s: &str) -> Option<T> {
    all.iter().copied().find(|v| name(*v) == s)
}

/// `clap::ValueEnum` for a `Copy` type with a table of values (`ALL` unless given) and
/// `as_str`: the command line offers and parses exactly the table's names.
macro_rules! value_enum {
    ($t:ty) => {
        $crate::names::value_enum!($t, <$t>::ALL);
    };
    ($t:ty, $all:expr) => {
        impl clap::ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                &$all
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(self.as_str()))
            }
        }
    };
}
pub(crate) use value_enum;

#[cfg(test)]
mod tests {
    use std::fmt::Debug;
    use std::str::FromStr;

    use clap::ValueEnum;

    use super::either;
    use crate::adapter::{Convention, Kind};
    use crate::gpu::DeviceChoice;
    use crate::layout::OutputDType;
    use crate::linalg::TruncMethod;
    use crate::merge::DoraStrength;
    use crate::model::wan_layout::Layout;
    use crate::quant::rules::QuantFormat;
    use crate::synth::{Fill, SynthModel};

    /// Every value clap offers parses back to itself through clap, through `FromStr` (what
    /// recipes use) and displays as the same name.
    fn one_table<T>(name: fn(&T) -> String)
    where
        T: ValueEnum + FromStr + PartialEq + Debug,
        <T as FromStr>::Err: Debug,
    {
        for v in T::value_variants() {
            let shown = v
                .to_possible_value()
                .expect("listed")
                .get_name()
                .to_string();
            assert_eq!(shown, name(v));
            assert_eq!(&<T as FromStr>::from_str(&shown).unwrap(), v, "{shown}");
            assert_eq!(&<T as ValueEnum>::from_str(&shown, false).unwrap(), v);
            assert!(<T as ValueEnum>::from_str(&shown.to_uppercase(), false).is_err());
        }
    }

    #[test]
    fn every_table_serves_clap_fromstr_and_display_alike() {
        one_table::<Layout>(ToString::to_string);
        one_table::<OutputDType>(ToString::to_string);
        one_table::<DoraStrength>(ToString::to_string);
        one_table::<Convention>(ToString::to_string);
        one_table::<QuantFormat>(ToString::to_string);
        one_table::<crate::pipeline::OutputFormat>(ToString::to_string);
        one_table::<DeviceChoice>(ToString::to_string);
        assert_eq!(
            OutputDType::value_variants().len(),
            OutputDType::ALL.len(),
            "keep, bf16, f16, f32"
        );
    }

    #[test]
    fn serde_spells_as_the_table() {
        for c in Convention::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
        for d in DoraStrength::ALL {
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
        }
        // `Kind` keeps serde's `rename_all`; reports, manifests and inspect spell it with
        // `as_str`, so the two must agree both ways.
        for k in Kind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(
                serde_json::from_value::<Kind>(k.as_str().into()).unwrap(),
                k
            );
            assert_eq!(k.to_string(), k.as_str());
        }
    }

    #[test]
    fn parameterised_values_are_named_by_kind() {
        let names = |v: &[TruncMethod]| v.iter().map(|m| m.as_str()).collect::<Vec<_>>();
        assert_eq!(
            names(TruncMethod::value_variants()),
            ["randomized", "exact"]
        );
        assert_eq!(
            <TruncMethod as ValueEnum>::from_str("randomized", false).unwrap(),
            TruncMethod::RANDOMIZED
        );
        assert_eq!(
            <Fill as ValueEnum>::from_str("random", false)
                .unwrap()
                .seeded(7),
            Fill::Random { seed: 7 }
        );
        assert_eq!(Fill::Zero.seeded(7), Fill::Zero);
        for m in SynthModel::value_variants() {
            let id = m.id().expect("named");
            assert_eq!(SynthModel::parse(id).as_ref(), Some(m));
        }
        assert!(SynthModel::parse("wan2.2-t2v-a14b").is_some());
    }

    #[test]
    fn dtype_aliases_are_the_pytorch_spellings() {
        for (alias, d) in [
            ("float32", OutputDType::F32),
            ("float16", OutputDType::F16),
            ("fp16", OutputDType::F16),
            ("bfloat16", OutputDType::BF16),
        ] {
            assert_eq!(alias.parse::<OutputDType>().unwrap(), d);
            assert_eq!(
                <OutputDType as ValueEnum>::from_str(alias, false).unwrap(),
                d
            );
        }
        assert!("BF16".parse::<OutputDType>().is_err());
    }

    #[test]
    fn either_lists() {
        assert_eq!(either(["a"]), "a");
        assert_eq!(either(["a", "b", "c"]), "a, b or c");
        assert_eq!(
            either(Layout::ALL.map(Layout::as_str)),
            "diffusers, wan, nnx or nnx-scanned"
        );
    }
}
