//! From how the guest command ended to stockade's exit status, as `docker
//! run` and `env` do it: the command's own status, 125 when stockade failed,
//! 126 not executable, 127 not found, 128+n killed by signal n.

use crate::protocol::ExitReport;
use crate::protocol::exit::{EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_STOCKADE};

/// The exit status and, when stockade should say something, the message.
pub fn exit_status(report: &ExitReport) -> (u8, Option<String>) {
    match report {
        // The low byte, as a shell reports an exit status.
        ExitReport::Exited { code } => (code.to_le_bytes()[0], None),
        ExitReport::Signaled { signal } => (128 | signal.to_le_bytes()[0] & 0x7f, None),
        ExitReport::NotStarted { not_found: true, message } => (EXIT_NOT_FOUND, Some(message.clone())),
        ExitReport::NotStarted { not_found: false, message } => (EXIT_NOT_EXECUTABLE, Some(message.clone())),
        ExitReport::SetupFailed { message } => {
            (EXIT_STOCKADE, Some(format!("the guest could not start the command: {message}")))
        }
    }
}

/// The run record's words for an outcome.
pub fn describe(report: &ExitReport) -> String {
    match report {
        ExitReport::Exited { code } => format!("exited with status {code}"),
        ExitReport::Signaled { signal } => format!("killed by signal {signal}"),
        ExitReport::NotStarted { message, .. } => format!("not started: {message}"),
        ExitReport::SetupFailed { message } => format!("setup failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_docker_run() {
        assert_eq!(exit_status(&ExitReport::Exited { code: 7 }).0, 7);
        assert_eq!(exit_status(&ExitReport::Signaled { signal: 2 }).0, 130);
        assert_eq!(exit_status(&ExitReport::Signaled { signal: 9 }).0, 137);
        let nf = ExitReport::NotStarted { not_found: true, message: "x: command not found".into() };
        assert_eq!(exit_status(&nf), (127, Some("x: command not found".into())));
        let ne = ExitReport::NotStarted { not_found: false, message: "x: permission denied".into() };
        assert_eq!(exit_status(&ne).0, 126);
        assert_eq!(exit_status(&ExitReport::SetupFailed { message: "m".into() }).0, 125);
    }
}
