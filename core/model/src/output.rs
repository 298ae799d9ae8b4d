//! Where a task's stdout and stderr go: inline in the task document or to GridFS (Disbatch's rules).

use serde_json::Value;

/// Disbatch's threshold for `gfs: "auto"`: 15 MiB, inclusive.
pub const GFS_AUTO_LIMIT: u64 = 15 * 1024 * 1024;

/// MongoDB's document size limit; inline output above it can never be stored.
pub const MAX_DOCUMENT_SIZE: u64 = 16 * 1024 * 1024;

/// A plugin result whose attempt record would hold more than this, as BSON, keeps its
/// `output` in GridFS instead (as JSON text): the bound stdout has under `gfs: "auto"`.
/// BSON can be several times the JSON (an array's every element carries its index as a
/// key), so a result file well under 16 MiB may need it.
pub const RESULT_INLINE_LIMIT: u64 = GFS_AUTO_LIMIT;

/// The `gfs` config setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GfsMode {
    /// Always inline; output too large for a document is replaced by an error text.
    Off,
    /// Always GridFS, even for empty output.
    On,
    /// Inline unless Disbatch's 15 MiB rules say otherwise.
    #[default]
    Auto,
}

impl GfsMode {
    /// Accepts `true`/`false`/`"auto"` and the Perl-era spellings `1`/`0`/`"1"`/`"0"`.
    pub fn from_config(value: &Value) -> Result<Self, String> {
        match value {
            Value::Bool(true) => Ok(GfsMode::On),
            Value::Bool(false) => Ok(GfsMode::Off),
            Value::Number(n) if n.as_f64() == Some(1.0) => Ok(GfsMode::On),
            Value::Number(n) if n.as_f64() == Some(0.0) => Ok(GfsMode::Off),
            Value::String(s) => match s.as_str() {
                "auto" => Ok(GfsMode::Auto),
                "1" | "true" => Ok(GfsMode::On),
                "0" | "false" | "" => Ok(GfsMode::Off),
                other => Err(format!("{other:?} is not one of false, true or \"auto\"")),
            },
            other => Err(format!("{other} is not one of false, true or \"auto\"")),
        }
    }
}

/// Where one output stream is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Inline,
    GridFs,
    /// Too large to store with `gfs: false`: replaced by an explanation, as Disbatch does.
    Dropped,
}

/// The placement of both streams of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputPlan {
    pub stdout: Placement,
    pub stderr: Placement,
}

/// Decides placement from the byte lengths of the (UTF-8) outputs.
pub fn plan_output(mode: GfsMode, stdout_len: u64, stderr_len: u64) -> OutputPlan {
    use Placement::*;
    match mode {
        GfsMode::On => OutputPlan {
            stdout: GridFs,
            stderr: GridFs,
        },
        GfsMode::Auto => {
            if stdout_len.saturating_add(stderr_len) <= GFS_AUTO_LIMIT {
                OutputPlan {
                    stdout: Inline,
                    stderr: Inline,
                }
            } else if stderr_len <= GFS_AUTO_LIMIT {
                OutputPlan {
                    stdout: GridFs,
                    stderr: Inline,
                }
            } else {
                OutputPlan {
                    stdout: GridFs,
                    stderr: GridFs,
                }
            }
        }
        GfsMode::Off => {
            // Disbatch sacrifices stdout first; stderr survives when it fits on its own.
            let fits_together = stdout_len.saturating_add(stderr_len) < MAX_DOCUMENT_SIZE;
            OutputPlan {
                stdout: if fits_together { Inline } else { Dropped },
                stderr: if stderr_len < MAX_DOCUMENT_SIZE {
                    Inline
                } else {
                    Dropped
                },
            }
        }
    }
}

impl OutputPlan {
    /// The next plan to try after the database refused a document as too large, or None
    /// when nothing inline is left to move. GridFS modes move output out of the document;
    /// `gfs: false` drops it, stdout first.
    pub fn after_too_large(self, mode: GfsMode) -> Option<OutputPlan> {
        use Placement::*;
        let escape = if mode == GfsMode::Off {
            Dropped
        } else {
            GridFs
        };
        if self.stdout == Inline {
            Some(OutputPlan {
                stdout: escape,
                ..self
            })
        } else if self.stderr == Inline {
            Some(OutputPlan {
                stderr: escape,
                ..self
            })
        } else {
            None
        }
    }
}

/// The text stored in place of output that could not be kept.
pub fn dropped_output_text(stream: &str, len: u64) -> String {
    format!(
        "Error: {stream} ({len} bytes) was not stored: the task document would exceed MongoDB's \
         16 MiB limit and gfs is false. Set gfs to \"auto\" or true to keep large output."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Placement::*;

    const MIB: u64 = 1024 * 1024;

    fn plan(mode: GfsMode, out: u64, err: u64) -> (Placement, Placement) {
        let p = plan_output(mode, out, err);
        (p.stdout, p.stderr)
    }

    #[test]
    fn auto_follows_disbatch_fifteen_mib_rules_inclusively() {
        assert_eq!(plan(GfsMode::Auto, 0, 0), (Inline, Inline));
        assert_eq!(plan(GfsMode::Auto, 15 * MIB, 0), (Inline, Inline));
        assert_eq!(plan(GfsMode::Auto, 7 * MIB, 8 * MIB), (Inline, Inline));
        assert_eq!(plan(GfsMode::Auto, 15 * MIB + 1, 0), (GridFs, Inline));
        assert_eq!(plan(GfsMode::Auto, 8 * MIB, 8 * MIB), (GridFs, Inline));
        assert_eq!(plan(GfsMode::Auto, 1, 15 * MIB), (GridFs, Inline));
        assert_eq!(plan(GfsMode::Auto, 0, 15 * MIB + 1), (GridFs, GridFs));
    }

    #[test]
    fn on_always_uses_gridfs_even_for_empty_output() {
        assert_eq!(plan(GfsMode::On, 0, 0), (GridFs, GridFs));
        assert_eq!(plan(GfsMode::On, 5, 20 * MIB), (GridFs, GridFs));
    }

    #[test]
    fn off_keeps_output_inline_and_drops_stdout_first_when_too_large() {
        assert_eq!(plan(GfsMode::Off, 15 * MIB, 0), (Inline, Inline));
        assert_eq!(plan(GfsMode::Off, 15 * MIB, MIB), (Dropped, Inline));
        assert_eq!(plan(GfsMode::Off, 16 * MIB, 0), (Dropped, Inline));
        assert_eq!(plan(GfsMode::Off, 0, 16 * MIB), (Dropped, Dropped));
    }

    #[test]
    fn refusal_escalates_stdout_then_stderr_then_gives_up() {
        let p = plan_output(GfsMode::Auto, 1, 1);
        let p = p.after_too_large(GfsMode::Auto).expect("stdout moves");
        assert_eq!((p.stdout, p.stderr), (GridFs, Inline));
        let p = p.after_too_large(GfsMode::Auto).expect("stderr moves");
        assert_eq!((p.stdout, p.stderr), (GridFs, GridFs));
        assert_eq!(p.after_too_large(GfsMode::Auto), None);

        let p = plan_output(GfsMode::Off, 1, 1).after_too_large(GfsMode::Off);
        assert_eq!(p.map(|p| (p.stdout, p.stderr)), Some((Dropped, Inline)));
    }

    #[test]
    fn gfs_setting_accepts_disbatch_spellings_and_rejects_others() {
        use serde_json::json;
        assert_eq!(GfsMode::from_config(&json!(true)), Ok(GfsMode::On));
        assert_eq!(GfsMode::from_config(&json!(false)), Ok(GfsMode::Off));
        assert_eq!(GfsMode::from_config(&json!("auto")), Ok(GfsMode::Auto));
        assert_eq!(GfsMode::from_config(&json!(1)), Ok(GfsMode::On));
        assert_eq!(GfsMode::from_config(&json!("0")), Ok(GfsMode::Off));
        assert!(GfsMode::from_config(&json!("sometimes")).is_err());
        assert!(GfsMode::from_config(&json!([1])).is_err());
    }
}
