//! Trying again only what may change: timeouts, resets, 5xx and 429 with exponential backoff and jitter up to `Config::tries`; a refused connection a few times only; everything else (a name that does not resolve, an untrusted certificate, 400/401/403/404) never.

use std::time::{Duration, Instant, SystemTime};

use crate::client::Client;
use crate::error::RemoteError;

/// Tries for a refused connection (nothing listens at the address). With the default
/// backoff the pauses between them are 0.2-0.4, 0.4-0.8 and 0.8-1.6 s: a server that is
/// down fails in about 2 s (all 8 tries took 25 s), and one that restarts (nginx does in
/// well under a second) is still waited for.
pub(crate) const REFUSED_TRIES: u32 = 4;

/// The tries `e` allows of `tries`.
pub(crate) fn allowed(e: &RemoteError, tries: u32) -> u32 {
    match e {
        RemoteError::Refused(_) => tries.min(REFUSED_TRIES),
        _ => tries,
    }
    .max(1)
}

/// `e` after its last try, saying how many there were and how long they took: a user
/// who waited knows why.
pub(crate) fn gave_up(e: RemoteError, tries: u32, since: Instant) -> RemoteError {
    let plural = if tries == 1 { "try" } else { "tries" };
    let note = format!(" (gave up after {tries} {plural} in {:.1} s)", since.elapsed().as_secs_f64());
    match e {
        RemoteError::Unavailable(m) => RemoteError::Unavailable(m + &note),
        RemoteError::Refused(m) => RemoteError::Refused(m + &note),
        other => other,
    }
}

impl Client {
    /// Runs `attempt` until it succeeds, fails for good, or used the tries its failure
    /// allows ([`allowed`]), pausing with exponential backoff and jitter in between;
    /// `cancelled` is polled during the pauses.
    pub(crate) fn retrying<T>(
        &self,
        cancelled: &dyn Fn() -> bool,
        mut attempt: impl FnMut() -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        let tries = self.inner.config.tries.max(1);
        let started = Instant::now();
        let mut expired_once = false;
        for n in 1.. {
            match attempt() {
                Err(RemoteError::Denied(m)) if m.contains("ExpiredToken") && !expired_once => {
                    // Temporary credentials ran out: fetch them again, once.
                    expired_once = true;
                    self.inner.chain.forget();
                }
                Err(e) if e.is_transient() && n < allowed(&e, tries) => {
                    let of = allowed(&e, tries);
                    if !self.again(n, cancelled, |wait| format!("{e} (try {n} of {of}; again in {wait:.1} s)")) {
                        return Err(RemoteError::Cancelled);
                    }
                }
                Err(e) => return Err(gave_up(e, n, started)),
                Ok(value) => return Ok(value),
            }
        }
        unreachable!("the loop returns")
    }

    /// Says that try `n` failed and will be tried again (`line`, given the pause in
    /// seconds: to the caller's [`crate::config::RetryHook`], else the log), then sleeps the backoff
    /// before try `n + 1`; false if cancelled meanwhile. `what` is in the line already: it
    /// begins with the error, which names the object.
    pub(crate) fn again(&self, n: u32, cancelled: &dyn Fn() -> bool, line: impl FnOnce(f64) -> String) -> bool {
        let base = self.inner.config.backoff.as_millis() as u64;
        let cap = base.saturating_mul(1 << n.min(16)).min(10_000);
        let wait = Duration::from_millis(cap / 2 + jitter(cap / 2 + 1));
        let line = line(wait.as_secs_f64());
        match &self.inner.config.on_retry {
            Some(hook) => hook.call(&line),
            None => tracing::info!("{line}"),
        }
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if cancelled() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20).min(wait));
        }
        !cancelled()
    }
}

/// A few random-enough milliseconds below `range` (spreads retries of many threads).
fn jitter(range: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() % range.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_connections_get_a_few_tries_and_permanent_failures_none() {
        assert_eq!(allowed(&RemoteError::Refused(String::new()), 8), REFUSED_TRIES);
        assert_eq!(allowed(&RemoteError::Refused(String::new()), 2), 2);
        assert_eq!(allowed(&RemoteError::Unavailable(String::new()), 8), 8);
        for permanent in [RemoteError::Unreachable(String::new()), RemoteError::Denied(String::new())] {
            assert!(!permanent.is_transient());
        }
        let e = gave_up(RemoteError::Refused("refused".into()), 1, Instant::now());
        assert!(e.to_string().starts_with("refused (gave up after 1 try in 0."), "{e}");
    }
}
