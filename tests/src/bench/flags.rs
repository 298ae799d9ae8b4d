//! The small bench binaries' command lines: `--flag N` pairs of whole numbers.

use std::collections::HashMap;

use anyhow::Context;

/// The `--flag N` pairs of this process's arguments, each flag one of `known`.
pub fn whole_numbers(known: &[&str]) -> anyhow::Result<HashMap<String, u64>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    parse(&args, known)
}

fn parse(args: &[String], known: &[&str]) -> anyhow::Result<HashMap<String, u64>> {
    let mut out = HashMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        anyhow::ensure!(
            known.contains(&flag.as_str()),
            "unknown option {flag} (known: {})",
            known.join(", ")
        );
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let n: u64 = value
            .parse()
            .with_context(|| format!("{flag} {value:?}: expected a whole number"))?;
        out.insert(flag.clone(), n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_read_and_unknown_flags_or_values_refused() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = parse(
            &args(&["--tasks", "5", "--dens", "2"]),
            &["--tasks", "--dens"],
        )
        .expect("ok");
        assert_eq!(got.get("--tasks"), Some(&5));
        assert_eq!(got.get("--dens"), Some(&2));
        assert!(parse(&args(&["--nope", "1"]), &["--tasks"]).is_err());
        assert!(parse(&args(&["--tasks"]), &["--tasks"]).is_err());
        assert!(parse(&args(&["--tasks", "x"]), &["--tasks"]).is_err());
    }
}
