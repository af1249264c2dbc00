//! The HEALTH EVENTS section of `status`: the newest entries of the agent's journal
//! (`GET /api/v1/events`, newest first), those read back from before the agent's last restart
//! marked as such, so that what happened before a restart or an upgrade stays in view.
//!
//! Must not: print anything from the agent unescaped (reasons carry process names).

use serde_json::Value;

use crate::terminal::escape;

/// How many events the section asks for (it is cut to the terminal like the others).
pub(super) const SHOWN: usize = 10;

/// One line per event, newest first: `18:17:57 GPU 3 raised xid_79 [fail, reboot_node]: …`,
/// with the date when the event is not from `today` (`YYYY-MM-DD`, UTC as the journal is).
pub(super) fn lines(answer: &Value, today: &str) -> Vec<String> {
    answer["events"]
        .as_array()
        .into_iter()
        .flatten()
        .take(SHOWN)
        .map(|e| line(e, today))
        .collect()
}

fn line(e: &Value, today: &str) -> String {
    let field = |k: &str| escape(e[k].as_str().unwrap_or("?")).into_owned();
    let ts = field("time");
    let time = ts.get(11..19).unwrap_or(&ts).to_string();
    let when = if ts.get(..10) == Some(today) {
        time
    } else {
        format!("{} {time}", ts.get(..10).unwrap_or(&ts))
    };
    let gpu = e["gpu"].as_u64().map_or("?".to_string(), |g| g.to_string());
    // First: a narrow terminal cuts the end of the line, and an old failure must not look
    // current.
    let before = if e["before_restart"].as_bool() == Some(true) {
        "(before the agent's restart) "
    } else {
        ""
    };
    format!(
        "{before}{when} GPU {gpu} {} {} [{}, {}]: {}",
        field("kind"),
        field("condition"),
        field("severity"),
        field("action"),
        field("reason"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_from_before_a_restart_are_marked_and_old_ones_dated() {
        let answer = serde_json::json!({"events": [
            {"time": "2026-11-26T07:00:01Z", "gpu": 3, "uuid": "GPU-3", "kind": "raised",
             "condition": "xid_79", "severity": "fail", "action": "reboot_node",
             "reason": "XID 79 \u{1b}[31m"},
            {"time": "2026-11-25T23:59:59Z", "gpu": 1, "uuid": "GPU-1", "kind": "cleared",
             "condition": "thermal", "severity": "pass", "action": "none",
             "reason": "cleared", "before_restart": true},
        ]});
        let l = lines(&answer, "2026-11-26");
        assert_eq!(
            l,
            vec![
                "07:00:01 GPU 3 raised xid_79 [fail, reboot_node]: XID 79 \\u{1b}[31m".to_string(),
                "(before the agent's restart) 2026-11-25 23:59:59 GPU 1 cleared thermal \
                 [pass, none]: cleared"
                    .to_string(),
            ]
        );
    }

    #[test]
    fn at_most_the_newest_ten_are_asked_for() {
        let e = serde_json::json!({"time": "2026-11-26T07:00:01Z", "gpu": 0, "kind": "observed",
            "condition": "xid_13", "severity": "warn", "action": "none", "reason": "XID 13"});
        let answer = serde_json::json!({ "events": vec![e; 25] });
        assert_eq!(lines(&answer, "2026-11-26").len(), SHOWN);
    }
}
