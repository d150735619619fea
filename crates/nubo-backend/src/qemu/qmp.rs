//! A small QMP client, generic over its transport so tests drive it with in-memory streams.
//! QMP is line-delimited JSON: a greeting, `qmp_capabilities`, then commands whose replies are
//! `{"return": ...}` or `{"error": {...}}`, interleaved with asynchronous `{"event": ...}`s.

use std::io::{self, BufRead, Write};

use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP transport")]
    Io(#[from] io::Error),
    #[error("QMP peer closed the connection")]
    Closed,
    #[error("QMP sent something that is not JSON: {line:?}")]
    Malformed { line: String },
    #[error("QMP greeting missing: got {0}")]
    NoGreeting(String),
    #[error("QMP command `{command}` failed: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
}

pub struct Qmp<R, W> {
    reader: R,
    writer: W,
    /// Events seen while waiting for replies, oldest first.
    pub events: Vec<Value>,
}

/// QMP replies are small; a peer that sends a longer line is not QEMU.
const MAX_LINE: usize = 1 << 20;

impl<R: BufRead, W: Write> Qmp<R, W> {
    /// Reads the greeting and negotiates capabilities.
    pub fn handshake(reader: R, writer: W) -> Result<Self, QmpError> {
        let mut q = Qmp {
            reader,
            writer,
            events: Vec::new(),
        };
        let greeting = q.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::NoGreeting(greeting.to_string()));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": command });
        if let Some(args) = arguments {
            msg["arguments"] = args;
        }
        let mut line = serde_json::to_vec(&msg).expect("a json! value always serialises");
        line.push(b'\n');
        self.writer.write_all(&line)?;
        self.writer.flush()?;
        loop {
            let mut reply = self.read_message()?;
            if reply.get("event").is_some() {
                self.events.push(reply);
                continue;
            }
            if let Some(ret) = reply.get_mut("return") {
                return Ok(ret.take());
            }
            if let Some(err) = reply.get("error") {
                let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                return Err(QmpError::Command {
                    command: command.to_owned(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            return Err(QmpError::Malformed {
                line: reply.to_string(),
            });
        }
    }

    /// `query-status`'s `status` field: `running`, `paused`, `shutdown`, `prelaunch`, ...
    pub fn status(&mut self) -> Result<String, QmpError> {
        let r = self.execute("query-status", None)?;
        Ok(r.get("status").and_then(Value::as_str).unwrap_or("unknown").to_owned())
    }

    /// What was sent so far (tests over an in-memory writer).
    #[cfg(test)]
    pub(crate) fn writer_bytes(&self) -> &[u8]
    where
        W: AsRef<[u8]>,
    {
        self.writer.as_ref()
    }

    fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = io::Read::take(self.reader.by_ref(), MAX_LINE as u64).read_until(b'\n', &mut buf)?;
            if n == 0 {
                return Err(QmpError::Closed);
            }
            let text = String::from_utf8_lossy(&buf);
            let trimmed = text.trim();
            if trimmed.is_empty() {
                continue;
            }
            return serde_json::from_str(trimmed).map_err(|_| QmpError::Malformed {
                line: trimmed.chars().take(200).collect(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    const GREETING: &str =
        r#"{"QMP": {"version": {"qemu": {"micro": 2, "minor": 0, "major": 10}}, "capabilities": []}}"#;

    fn client(replies: &str) -> Qmp<Cursor<Vec<u8>>, Vec<u8>> {
        let input = format!("{GREETING}\n{{\"return\": {{}}}}\n{replies}");
        Qmp::handshake(Cursor::new(input.into_bytes()), Vec::new()).unwrap()
    }

    #[test]
    fn handshake_sends_capabilities() {
        let q = client("");

        assert_eq!(
            String::from_utf8(q.writer).unwrap(),
            "{\"execute\":\"qmp_capabilities\"}\n"
        );
    }

    #[test]
    fn status_skips_events_and_keeps_them() {
        let mut q = client(
            "{\"event\": \"RESUME\", \"timestamp\": {\"seconds\": 1, \"microseconds\": 2}}\n{\"return\": {\"status\": \"running\", \"running\": true}}\n",
        );

        assert_eq!(q.status().unwrap(), "running");
        assert_eq!(q.events.len(), 1);
    }

    #[test]
    fn execute_error_reply_is_command_error() {
        let mut q = client("{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}\n");

        let err = q.execute("system_powerdown", None).unwrap_err();

        assert!(
            matches!(err, QmpError::Command { ref class, .. } if class == "GenericError"),
            "{err}"
        );
    }

    #[test]
    fn execute_sends_arguments() {
        let mut q = client("{\"return\": {}}\n");

        q.execute("human-monitor-command", Some(json!({"command-line": "info status"})))
            .unwrap();

        assert!(String::from_utf8_lossy(&q.writer).contains("\"arguments\":{\"command-line\":\"info status\"}"));
    }

    #[test]
    fn execute_peer_closed_is_closed() {
        let mut q = client("");

        assert!(matches!(q.execute("query-status", None), Err(QmpError::Closed)));
    }

    #[test]
    fn handshake_without_greeting_refused() {
        let r = Qmp::handshake(Cursor::new(b"{\"return\": {}}\n".to_vec()), Vec::new());

        assert!(matches!(r, Err(QmpError::NoGreeting(_))));
    }

    #[test]
    fn read_garbage_is_malformed() {
        let mut q = client("not json\n");

        assert!(matches!(
            q.execute("query-status", None),
            Err(QmpError::Malformed { .. })
        ));
    }
}
