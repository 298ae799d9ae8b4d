//! A strict checker of the Prometheus text exposition format (0.0.4), for the metrics tests.
//!
//! Standard library only: den's unit tests include this file too (`#[path]`).

use std::collections::{HashMap, HashSet};

/// Label name and value pairs, in written order.
pub type Labels = Vec<(String, String)>;

/// One sample line: metric name, labels in written order, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

/// A checked exposition.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Family name → type, from the TYPE lines.
    pub types: HashMap<String, String>,
}

impl Exposition {
    /// The value of the sample with exactly these labels (in any order).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .map(|s| s.value)
    }
}

/// Checks every line: HELP and TYPE lines well formed, at most one of each per family and the
/// TYPE before the family's samples; families contiguous; names valid; label values quoted with
/// only the three escapes the format defines; values numbers; no series twice; histogram
/// buckets cumulative with `+Inf` equal to `_count`. Returns the parsed samples.
pub fn check(text: &str) -> Result<Exposition, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the exposition does not end with a line feed".into());
    }
    let mut out = Exposition::default();
    let mut helped = HashSet::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut series = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let at = |m: String| format!("line {}: {m}: {line:?}", i + 1);
        let family = if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            check_help(help).map_err(at)?;
            if !helped.insert(name.to_string()) {
                return Err(at("a second HELP for the family".into()));
            }
            name.to_string()
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| at("TYPE without a type".into()))?;
            if !matches!(
                kind,
                "counter" | "gauge" | "histogram" | "summary" | "untyped"
            ) {
                return Err(at(format!("unknown type {kind:?}")));
            }
            if out
                .types
                .insert(name.to_string(), kind.to_string())
                .is_some()
            {
                return Err(at("a second TYPE for the family".into()));
            }
            name.to_string()
        } else if line.starts_with('#') {
            continue;
        } else {
            let sample = parse_sample(line).map_err(at)?;
            let family = family_of(&sample.name, &out.types);
            match out.types.get(&family).map(String::as_str) {
                None => return Err(at("a sample before its family's TYPE".into())),
                Some("histogram") => {
                    let le = sample.labels.iter().any(|(k, _)| k == "le");
                    let ok = match sample.name.strip_prefix(family.as_str()) {
                        Some("_bucket") => le,
                        Some("_sum" | "_count") => !le,
                        _ => false,
                    };
                    if !ok {
                        return Err(at("not a histogram sample of its family".into()));
                    }
                }
                Some("counter" | "gauge" | "untyped") if sample.name != family => {
                    return Err(at("not a sample of its family".into()));
                }
                _ => {}
            }
            let mut key = sample.labels.clone();
            key.sort();
            if !series.insert((sample.name.clone(), key)) {
                return Err(at("the same series twice".into()));
            }
            out.samples.push(sample);
            family
        };
        check_name(&family, true).map_err(at)?;
        if current.as_deref() != Some(family.as_str()) {
            if finished.contains(&family) {
                return Err(at("the family continues after another family began".into()));
            }
            if let Some(previous) = current.replace(family) {
                finished.insert(previous);
            }
        }
    }
    check_histograms(&out)?;
    Ok(out)
}

/// Characters no scrape should carry, whatever the names stored: controls other than the line
/// feeds ending lines (NUL, ESC, C1) and bidi overrides, embeddings, isolates and marks.
/// Written apart from the code under test, so it checks it rather than repeats it.
pub fn hidden_characters(text: &str) -> Vec<(usize, char)> {
    text.lines()
        .enumerate()
        .flat_map(|(i, line)| line.chars().map(move |c| (i + 1, c)))
        .filter(|&(_, c)| {
            c.is_control()
                || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// A histogram sample belongs to the family named without its suffix, once that family's TYPE
/// says histogram; every other sample to the family of its own name.
fn family_of(name: &str, types: &HashMap<String, String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if matches!(
                types.get(base).map(String::as_str),
                Some("histogram" | "summary")
            ) {
                return base.to_string();
            }
        }
    }
    name.to_string()
}

fn check_name(name: &str, metric: bool) -> Result<(), String> {
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (metric && c == ':');
    let rest_ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (metric && c == ':');
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if first_ok(c) && chars.all(rest_ok) => {}
        _ => return Err(format!("invalid name {name:?}")),
    }
    if !metric && name.starts_with("__") {
        return Err(format!("label name {name:?} is reserved"));
    }
    Ok(())
}

/// HELP text may hold any UTF-8, with backslash and line feed escaped as `\\` and `\n`.
fn check_help(help: &str) -> Result<(), String> {
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !matches!(chars.next(), Some('\\' | 'n')) {
            return Err("a HELP escape other than \\\\ or \\n".into());
        }
    }
    Ok(())
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let name = &line[..name_end];
    check_name(name, true)?;
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or("no single space before the value")?;
    let mut fields = rest.split(' ');
    let value = parse_value(fields.next().unwrap_or(""))?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("timestamp {ts:?} is not an integer"))?;
    }
    if fields.next().is_some() {
        return Err("text after the timestamp".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Labels after the `{`, up to and including the `}`; returns them and the rest of the line.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels: Labels = Vec::new();
    loop {
        if let Some(tail) = s.strip_prefix('}') {
            return Ok((labels, tail));
        }
        let eq = s.find('=').ok_or("a label without '='")?;
        let name = &s[..eq];
        check_name(name, false)?;
        if labels.iter().any(|(n, _)| n == name) {
            return Err(format!("label {name:?} twice"));
        }
        let mut chars = s[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("label {name:?}: the value is not quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((j, c)) = chars.next() {
            match c {
                '"' => {
                    end = Some(eq + 1 + j + 1);
                    break;
                }
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => return Err(format!("label {name:?}: bad escape \\{other:?}")),
                },
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {name:?}: unterminated value"))?;
        labels.push((name.to_string(), value));
        s = &s[end..];
        if let Some(tail) = s.strip_prefix(',') {
            s = tail;
        } else if !s.starts_with('}') {
            return Err("labels not separated by ','".into());
        }
    }
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            v.parse::<f64>()
                .map_err(|_| format!("value {v:?} is not a number"))
        }
        _ => Err(format!("value {v:?} is not a number")),
    }
}

/// Each histogram series: buckets cumulative, a `+Inf` bucket, and it equal to `_count`.
fn check_histograms(e: &Exposition) -> Result<(), String> {
    for (family, kind) in &e.types {
        if kind != "histogram" {
            continue;
        }
        let bucket = format!("{family}_bucket");
        let mut series: HashMap<Labels, Vec<(f64, f64)>> = HashMap::new();
        for s in e.samples.iter().filter(|s| s.name == bucket) {
            let mut key: Vec<(String, String)> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "le")
                .cloned()
                .collect();
            key.sort();
            let le = s
                .labels
                .iter()
                .find(|(k, _)| k == "le")
                .map(|(_, v)| parse_value(v))
                .transpose()?
                .ok_or_else(|| format!("{bucket} without le"))?;
            series.entry(key).or_default().push((le, s.value));
        }
        for (key, buckets) in series {
            let mut last = (f64::NEG_INFINITY, 0.0);
            for &(le, n) in &buckets {
                if le <= last.0 || n < last.1 {
                    return Err(format!(
                        "{bucket}{key:?}: buckets not increasing and cumulative"
                    ));
                }
                last = (le, n);
            }
            if last.0 != f64::INFINITY {
                return Err(format!("{bucket}{key:?}: no +Inf bucket last"));
            }
            let labels: Vec<(&str, &str)> =
                key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let count = e.value(&format!("{family}_count"), &labels);
            if count != Some(last.1) {
                return Err(format!(
                    "{family}{key:?}: _count {count:?} is not the +Inf bucket {}",
                    last.1
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_exposition_passes_and_is_parsed() {
        let text = "# HELP a_total Things \\\\ done\\n.\n# TYPE a_total counter\n\
                    a_total{q=\"x\\\"y\\\\z\\n\"} 3\na_total{q=\"\"} 0 1700000000000\n\
                    # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\n";
        let e = check(text).expect("valid");
        assert_eq!(e.value("a_total", &[("q", "x\"y\\z\n")]), Some(3.0));
        assert_eq!(e.value("h_count", &[]), Some(2.0));
    }

    #[test]
    fn hidden_characters_are_found_with_their_line() {
        assert_eq!(hidden_characters("a 1\nb{q=\"x\\ny\"} 2\n"), vec![]);
        assert_eq!(
            hidden_characters("a 1\nb{q=\"\u{1b}[31m\0\u{202e}\"} 2\r\n"),
            vec![(2, '\u{1b}'), (2, '\0'), (2, '\u{202e}')]
        );
    }

    #[test]
    fn each_kind_of_mistake_is_caught() {
        let bad = [
            ("x 1\n", "before its family's TYPE"),
            ("# TYPE x gauge\nx 1", "line feed"),
            ("# TYPE x gauge\nx{q=\"a\"b\"} 1\n", "separated"),
            ("# TYPE x gauge\nx{q=\"a\\b\"} 1\n", "bad escape"),
            ("# TYPE x gauge\nx{q=a} 1\n", "not quoted"),
            ("# TYPE x gauge\nx{q=\"a} 1\n", "unterminated"),
            ("# TYPE 1x gauge\n", "invalid name"),
            ("# TYPE x gauge\nx{__q=\"a\"} 1\n", "reserved"),
            ("# TYPE x gauge\nx one\n", "not a number"),
            ("# TYPE x gauge\nx 1\nx 2\n", "twice"),
            ("# TYPE x gauge\nx 1\n# TYPE x gauge\n", "second TYPE"),
            ("# TYPE x gauge\n# TYPE y gauge\ny 1\nx 1\n", "continues"),
            ("# TYPE x gauge\nx_other 1\n", "before its family's TYPE"),
            ("# TYPE x blob\n", "unknown type"),
            ("# HELP x a \\t\n", "HELP escape"),
            (
                "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n",
                "_count",
            ),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
                "cumulative",
            ),
        ];
        for (text, want) in bad {
            match check(text) {
                Ok(_) => panic!("accepted {text:?}"),
                Err(e) => assert!(e.contains(want), "{text:?}: {e} (wanted {want:?})"),
            }
        }
    }
}
