//! The config's reload ([`Reloader`]): the files watched, one reload at a
//! time, refused when it would turn the limits off; and the TLS files'.
//! Beside `crate::server`, which starts it.

use crate::config::{Config, ConfigError, LoadOptions};
use crate::net::tls::{Tls, TlsError};
use crate::net::watch::{FileStamp, fingerprint};
use crate::service::Shared;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Reloads the config files (and the TLS files) of a running server.
pub struct Reloader {
    pub(crate) shared: Arc<Shared>,
    pub(crate) paths: Vec<PathBuf>,
    /// How a reload reads them (a folder without a config file allowed
    /// with `Options::allow_empty_reload`).
    pub(crate) load_options: LoadOptions,
    /// `Options::allow_empty_reload`.
    pub(crate) allow_empty_reload: bool,
    /// The files as the last load read them, and a change seen since.
    /// Held through a reload, so that reloads (the watcher's, SIGHUP's)
    /// run one at a time.
    pub(crate) watched: parking_lot::Mutex<Watched>,
    pub(crate) give_back_memory: fn(),
    /// Reloads tried so far, good or bad.
    pub(crate) reloads: watch::Sender<u64>,
    /// TLS, when on.
    pub(crate) tls: Option<Arc<Tls>>,
}

impl Reloader {
    /// Reads the TLS files again (blocking: call it off the async
    /// runtime's threads) and, if they are good, serves new handshakes
    /// with them; if not, the old ones stay in force. Either way the
    /// outcome is logged. Without TLS, does nothing.
    ///
    /// # Errors
    ///
    /// The [`TlsError`] of the new files.
    pub fn reload_tls(&self) -> Result<(), TlsError> {
        self.tls.as_ref().map_or(Ok(()), |tls| tls.reload())
    }

    /// Loads the config files again and, if they are valid and the reload
    /// rule ([`Config::check_reload`]) lets them replace the config in
    /// force (or `Options::allow_empty_reload` is on), serves them from
    /// now on; if not, the old config keeps serving. Either way the reload
    /// is counted, and logged in one line. The watcher does not read the
    /// same files again.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of the new files, or of the reload rule.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let mut watched = self.watched.lock();
        // Taken before the files are read: a change made while they are
        // is seen by the next look.
        *watched = Watched {
            loaded: fingerprint(&self.paths),
            changing: None,
        };
        let result = self.load_again();
        drop(watched);
        self.reloads.send_modify(|n| *n += 1);
        result
    }

    /// The watcher's look at the files (blocking: they are read, and maybe
    /// parsed): a change is reloaded once it has settled, the files alike
    /// at two looks in a row, so that a file is not read while it is being
    /// written (a writer that stops for longer than the interval is the
    /// reload rule's business). `None` when nothing was reloaded.
    pub(crate) fn reload_if_settled(&self) -> Option<Result<(), ConfigError>> {
        let mut watched = self.watched.lock();
        let now = fingerprint(&self.paths);
        if now == watched.loaded {
            watched.changing = None;
            return None;
        }
        if watched.changing.as_ref() != Some(&now) {
            // Changed since the last look: look again before reading.
            watched.changing = Some(now);
            return None;
        }
        *watched = Watched {
            loaded: now,
            changing: None,
        };
        let result = self.load_again();
        drop(watched);
        self.reloads.send_modify(|n| *n += 1);
        Some(result)
    }

    /// Reloads tried so far (good or bad), to wait on.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Loads and serves the config files again, if the reload rule lets
    /// them replace the config in force. What the parse and the old config
    /// took goes back to the system before the outcome is logged.
    fn load_again(&self) -> Result<(), ConfigError> {
        let loaded = Config::load_with(&self.paths, &self.load_options);
        match apply(&self.shared, loaded, self.allow_empty_reload, self.give_back_memory) {
            Ok(Applied {
                domains,
                changes,
                emptying: true,
            }) => {
                tracing::warn!(
                    domains,
                    changes = %changes,
                    "config reloaded, although it empties limits (allowed by --allow-empty-reload)"
                );
                Ok(())
            }
            Ok(Applied { domains, changes, .. }) => {
                tracing::info!(domains, changes = %changes, "config reloaded");
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload failed; the previous config stays in force");
                Err(e)
            }
        }
    }
}

/// A new config in force: what [`apply`] did.
pub(crate) struct Applied {
    /// The domains now in force.
    pub(crate) domains: usize,
    /// What changed.
    pub(crate) changes: crate::config::ConfigChanges,
    /// The reload rule refused it, but `Options::allow_empty_reload` let
    /// it through.
    pub(crate) emptying: bool,
}

/// Serves `loaded` (a config read again, from files or from an xDS
/// control plane) in place of `shared`'s config if it loaded and the reload
/// rule ([`Config::check_reload`]) lets it (or `allow_empty_reload`); else
/// the config in force stays. Either way the reload is counted in the
/// metrics, and `loaded`'s warnings are logged; the caller logs the
/// outcome. Blocking (the old config is freed here, and `give_back_memory`
/// called): call it off the async runtime's threads.
///
/// # Errors
///
/// `loaded`'s [`ConfigError`], or the reload rule's.
pub(crate) fn apply(
    shared: &Shared,
    loaded: Result<Config, ConfigError>,
    allow_empty_reload: bool,
    give_back_memory: fn(),
) -> Result<Applied, ConfigError> {
    let loaded = loaded.inspect(log_warnings);
    let mut emptying = false;
    let checked = loaded.and_then(
        |config| match Config::check_reload(&shared.engine().config(), &config) {
            Err(_) if allow_empty_reload => {
                emptying = true;
                Ok(config)
            }
            checked => checked.map(|()| config),
        },
    );
    match checked.and_then(|config| shared.engine().replace_config(config)) {
        Ok(before) => {
            shared.service.metrics().reload(true);
            let after = shared.engine().config();
            shared.service.metrics().declare_domains(&after);
            let changes = crate::config::ConfigChanges::between(&before, &after);
            let domains = after.domains().count();
            drop(after);
            free_here(before);
            give_back_memory();
            Ok(Applied {
                domains,
                changes,
                emptying,
            })
        }
        Err(e) => {
            give_back_memory();
            shared.service.metrics().reload(false);
            Err(e)
        }
    }
}

/// What the config watcher knows of the files.
#[derive(Default)]
pub(crate) struct Watched {
    /// Their fingerprint when last loaded (at start, or by a reload good
    /// or bad).
    pub(crate) loaded: Vec<FileStamp>,
    /// Another fingerprint seen at the last look: a change not yet read,
    /// until a look finds it again.
    pub(crate) changing: Option<Vec<FileStamp>>,
}

/// Frees `config` on this thread (a reload's, off the runtime) rather than
/// on a request's: a large config takes long to free. Requests hold a
/// config for one decision; after 100 ms of waiting for them, the last of
/// them frees it.
pub(crate) fn free_here(config: Arc<Config>) {
    for _ in 0..100 {
        if Arc::strong_count(&config) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(config);
}

/// Logs each of a loaded config's warnings once (at start and at each
/// reload that loads it).
pub(crate) fn log_warnings(config: &Config) {
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
}
