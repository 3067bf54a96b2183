//! Upload of the archive to an S3-compatible object store. The local archive is the spool:
//! every archived file not recorded in the upload journal is uploaded on the next pass, so
//! nothing is lost while the store is down, and a restart neither loses nor repeats uploads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, MultipartUpload, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, RetryConfig,
};
use tokio::io::AsyncReadExt;
use tokio::sync::{watch, Mutex, Notify};

use super::journal::{version_of, Journal};
use super::retention::{list_files, versions, FileEntry};
use super::{add, ArchiveConfig, ArchiveError, ArchiveStats};

/// Files larger than this are uploaded in parts of this size (S3 multipart).
pub const MULTIPART_BYTES: u64 = 8 << 20;
/// How often `run` looks for new archived files while the store is healthy.
pub const IDLE_SCAN: Duration = Duration::from_secs(2);

/// Delay ceiling before retry number `failures` (1 = after the first failure): `initial_ms`
/// doubling up to `max_ms`, as [`crate::util::backoff::Backoff`] computes it (the delay itself
/// is jittered by it). 0 failures = no delay.
pub fn backoff_delay(initial_ms: u64, max_ms: u64, failures: u32) -> Duration {
    let mut b = crate::util::backoff::Backoff::new(initial_ms, max_ms);
    let mut d = Duration::ZERO;
    for _ in 0..failures.min(64) {
        d = b.fail_ceiling().0;
    }
    d
}

/// What one upload pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UploadReport {
    /// Files and bytes uploaded by this pass.
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    /// Files already in the store (by the journal).
    pub skipped_files: u64,
    /// Files still waiting (not attempted after a failure, or failed).
    pub pending_files: u64,
    pub pending_bytes: u64,
    /// The first store failure of the pass (the pass stops there; the rest waits for the next).
    pub error: Option<String>,
    /// Archived files that could not be read (skipped, retried next pass; the store is fine).
    pub local_errors: Vec<String>,
}

/// Uploads the archive (see the module docs). Cheap to share behind an `Arc`.
pub struct Uploader {
    store: Arc<dyn ObjectStore>,
    dir: std::path::PathBuf,
    prefix: String,
    retry_initial_ms: u64,
    retry_max_ms: u64,
    journal: Mutex<Journal>,
    stats: Arc<ArchiveStats>,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for Uploader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploader")
            .field("store", &self.store.to_string())
            .field("dir", &self.dir)
            .finish()
    }
}

impl Uploader {
    /// An uploader for `cfg.object_store`, with credentials from the standard AWS chain: the
    /// `AWS_*` environment (keys and session token, web identity, container credentials), then
    /// the profile of the shared credentials file (`AWS_PROFILE`, default `default`), then
    /// instance metadata.
    pub fn new(cfg: &ArchiveConfig) -> Result<Uploader, ArchiveError> {
        Uploader::build(cfg, None)
    }

    /// Like [`Uploader::new`] with explicit `(access key id, secret access key)`.
    pub fn with_credentials(
        cfg: &ArchiveConfig,
        credentials: Option<(String, String)>,
    ) -> Result<Uploader, ArchiveError> {
        Uploader::build(cfg, Some(credentials))
    }

    /// `credentials`: `None` = the standard AWS chain (see [`Uploader::new`]); `Some(None)` =
    /// none (IMDS / anonymous); `Some(Some(k, s))` = these.
    fn build(
        cfg: &ArchiveConfig,
        credentials: Option<Option<(String, String)>>,
    ) -> Result<Uploader, ArchiveError> {
        crate::util::install_crypto_provider();
        let os = &cfg.object_store;
        if os.bucket.is_empty() {
            return Err(ArchiveError::ObjectStore(
                "bucket is empty; set archive.object_store.bucket".into(),
            ));
        }
        let mut b = match credentials {
            // AWS_ACCESS_KEY_ID / _SECRET_ACCESS_KEY / _SESSION_TOKEN, web identity
            // (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, then the
            // shared credentials file's profile, then instance metadata.
            None => super::aws_profile::apply(AmazonS3Builder::from_env()),
            Some(_) => AmazonS3Builder::new(),
        }
        .with_bucket_name(&os.bucket)
        .with_region(&os.region)
        .with_allow_http(os.allow_http)
        .with_virtual_hosted_style_request(false)
        .with_client_options(
            ClientOptions::new()
                .with_allow_http(os.allow_http)
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(120)),
        )
        // Few quick retries inside one request; `run` does the long backoff.
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(30),
        });
        if !os.endpoint.is_empty() {
            b = b.with_endpoint(&os.endpoint);
        }
        if let Some(Some((k, s))) = credentials {
            b = b.with_access_key_id(k).with_secret_access_key(s);
        }
        // The store checks every upload against this digest (x-amz-checksum-sha256).
        b = b.with_checksum_algorithm(object_store::aws::Checksum::SHA256);
        let store = b
            .build()
            .map_err(|e| ArchiveError::ObjectStore(e.to_string()))?;
        Ok(Uploader {
            store: Arc::new(store),
            dir: cfg.dir.clone(),
            prefix: os.prefix.trim_matches('/').to_string(),
            retry_initial_ms: os.retry_initial_ms.max(1),
            retry_max_ms: os.retry_max_ms,
            journal: Mutex::new(Journal::load(&cfg.dir)?),
            stats: Arc::new(ArchiveStats::default()),
            wake: Arc::new(Notify::new()),
        })
    }

    /// Share counters with the [`super::Archive`] (`archive.stats()`).
    pub fn with_stats(mut self, stats: Arc<ArchiveStats>) -> Uploader {
        self.stats = stats;
        self
    }

    /// Notify this to make [`Uploader::run`] start a pass now (e.g. after a segment was archived).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// The object key of an archived file (`<prefix>/<path relative to the archive>`).
    pub fn key_of(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// Upload every archived file not uploaded yet. Stops at the first failure (the store is
    /// probably down); what is left waits for the next pass.
    pub async fn upload_pending(&self) -> UploadReport {
        let mut rep = UploadReport::default();
        let files = match list_files(&self.dir, false) {
            Ok(f) => f,
            Err(e) => {
                rep.error = Some(e.to_string());
                return rep;
            }
        };
        let mut journal = self.journal.lock().await;
        for f in &files {
            if journal.is_uploaded(&f.rel, f.version) {
                rep.skipped_files += 1;
                continue;
            }
            if rep.error.is_some() {
                rep.pending_files += 1;
                rep.pending_bytes += f.size();
                continue;
            }
            match self.upload_file(f).await {
                Ok(true) => {
                    if let Err(e) = journal.record(&f.rel, f.version) {
                        rep.error = Some(e.to_string());
                    }
                    rep.uploaded_files += 1;
                    rep.uploaded_bytes += f.size();
                }
                // Removed or rewritten meanwhile: the next pass sees its new state.
                Ok(false) => {}
                Err(fail) => {
                    add(&self.stats.upload_failures, 1);
                    rep.pending_files += 1;
                    rep.pending_bytes += f.size();
                    match fail {
                        Fail::Store(e) => rep.error = Some(format!("{}: {e}", f.path.display())),
                        Fail::Local(e) => rep
                            .local_errors
                            .push(format!("{}: {e}; check its permissions", f.path.display())),
                    }
                }
            }
        }
        for e in &rep.local_errors {
            tracing::warn!("archive upload: {e}");
        }
        if rep.error.is_none() {
            if let Err(e) = journal.compact(&versions(&files)) {
                tracing::warn!("upload journal: {e}");
            }
        }
        add(&self.stats.uploaded_files, rep.uploaded_files);
        add(&self.stats.uploaded_bytes, rep.uploaded_bytes);
        self.stats
            .backlog_files
            .store(rep.pending_files, Ordering::Relaxed);
        self.stats
            .backlog_bytes
            .store(rep.pending_bytes, Ordering::Relaxed);
        rep
    }

    /// Upload one file; Ok(false) when it vanished or changed while being read.
    async fn upload_file(&self, f: &FileEntry) -> Result<bool, Fail> {
        let local = |e: std::io::Error| Fail::Local(e.to_string());
        let store = |e: object_store::Error| Fail::Store(e.to_string());
        let key = self.key_of(&f.rel);
        let loc = ObjectPath::parse(&key).unwrap_or_else(|_| ObjectPath::from(key.as_str()));
        let mut file = match tokio::fs::File::open(&f.path).await {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(local(e)),
        };
        if f.size() <= MULTIPART_BYTES {
            let mut buf = Vec::with_capacity(f.size() as usize);
            file.read_to_end(&mut buf).await.map_err(local)?;
            if !unchanged(f, &file).await {
                return Ok(false);
            }
            let opts = PutOptions {
                mode: PutMode::Overwrite,
                ..Default::default()
            };
            self.store
                .put_opts(&loc, PutPayload::from(buf), opts)
                .await
                .map_err(store)?;
        } else {
            let mut up = self.store.put_multipart(&loc).await.map_err(store)?;
            let res: Result<bool, Fail> = async {
                loop {
                    let mut part = Vec::with_capacity(MULTIPART_BYTES as usize);
                    (&mut file)
                        .take(MULTIPART_BYTES)
                        .read_to_end(&mut part)
                        .await
                        .map_err(local)?;
                    if part.is_empty() {
                        break;
                    }
                    up.put_part(PutPayload::from(part)).await.map_err(store)?;
                }
                if !unchanged(f, &file).await {
                    return Ok(false);
                }
                up.complete().await.map_err(store)?;
                Ok(true)
            }
            .await;
            if !matches!(res, Ok(true)) {
                let _ = up.abort().await;
            }
            return res;
        }
        Ok(true)
    }

    /// Upload until `shutdown` turns true: a pass whenever woken or every [`IDLE_SCAN`]; while
    /// the store fails, retry with the shared jittered backoff (one warning per failure streak).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff =
            crate::util::backoff::Backoff::new(self.retry_initial_ms, self.retry_max_ms);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let rep = self.upload_pending().await;
            let delay = match &rep.error {
                Some(e) => {
                    let (delay, first) = backoff.fail();
                    if first {
                        tracing::warn!(pending_files = rep.pending_files, pending_bytes = rep.pending_bytes,
                            "object store upload failed, files stay spooled in the archive and are retried: {e}");
                    }
                    delay
                }
                None => {
                    let failures = backoff.succeed();
                    if failures > 0 {
                        tracing::info!(failures, "object store upload works again");
                    }
                    IDLE_SCAN
                }
            };
            let failures = backoff.failures();
            tokio::select! {
                _ = shutdown.changed() => {}
                _ = tokio::time::sleep(delay) => {}
                _ = self.wake.notified(), if failures == 0 => {}
            }
        }
    }
}

/// Why one file was not uploaded.
enum Fail {
    /// Reading the archived file failed.
    Local(String),
    /// The store refused or could not be reached.
    Store(String),
}

/// Whether the open file still is the version listed (not rewritten by an archive repeat).
async fn unchanged(f: &FileEntry, file: &tokio::fs::File) -> bool {
    file.metadata()
        .await
        .is_ok_and(|m| version_of(&m) == f.version)
        && tokio::fs::metadata(&f.path)
            .await
            .is_ok_and(|m| version_of(&m) == f.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let d = |n| backoff_delay(100, 1000, n).as_millis();
        assert_eq!(d(0), 0);
        assert_eq!(d(1), 100);
        assert_eq!(d(2), 200);
        assert_eq!(d(3), 400);
        assert_eq!(d(4), 800);
        assert_eq!(d(5), 1000);
        assert_eq!(d(200), 1000);
        // A cap below the first delay never shortens it; no overflow at huge values.
        assert_eq!(backoff_delay(500, 10, 3).as_millis(), 500);
        assert_eq!(
            backoff_delay(u64::MAX / 2, u64::MAX, 70).as_millis(),
            u128::from(u64::MAX)
        );
    }
}
