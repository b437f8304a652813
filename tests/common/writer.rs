//! A cluster client for proofs: it routes by slot itself, follows MOVED and
//! ASK, and counts a write as acknowledged only when `WAIT 1` on the same
//! connection, right after the SET, says a replica has it. Everything
//! acknowledged is recorded, with the longest gap between acknowledgements.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

/// CRC16/XMODEM of the key (no hash tags: the keys here have no braces).
pub fn slot_of(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for byte in key.bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

/// `ip` or `ip:port` → `ip:port` (6379 by default).
fn with_port(seed: &str) -> String {
    if seed.contains(':') { seed.to_owned() } else { format!("{seed}:6379") }
}

pub struct ClusterClient {
    password: String,
    /// Where to find the cluster when the slot map fails; shared so a test
    /// can point a running writer at new addresses (all Pods recreated).
    seeds: Arc<Mutex<Vec<String>>>,
    /// A failed call asks for a slot-map refresh before the next one.
    stale: bool,
    /// slot → "ip:port"
    slots: Vec<Option<String>>,
    connections: HashMap<String, MultiplexedConnection>,
}

enum Redirect {
    Moved(String),
    Ask(String),
}

/// MOVED or ASK, from a single command's error or a pipeline's: redis 1.x
/// wraps a pipelined command's error, and `redirect_node` reads only a bare
/// one (a redirect taken for a failure cost a 20 ms back-off and a slot-map
/// reload, which the write-pause figures then counted).
fn redirect(error: &redis::RedisError) -> Option<Redirect> {
    let errors = error.clone().into_server_errors()?;
    let (_, server) = errors.first()?;
    // "<slot> <ip>:<port>"
    let addr = server.details()?.split_ascii_whitespace().nth(1)?.to_owned();
    match server.code() {
        "MOVED" => Some(Redirect::Moved(addr)),
        "ASK" => Some(Redirect::Ask(addr)),
        _ => None,
    }
}

impl ClusterClient {
    pub async fn new(seeds: Vec<String>, password: &str) -> Self {
        let seeds = Arc::new(Mutex::new(seeds));
        let mut client = Self {
            password: password.into(),
            seeds,
            stale: false,
            slots: vec![None; 16384],
            connections: HashMap::new(),
        };
        client.refresh().await;
        client
    }

    async fn connection(&mut self, addr: &str) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(c) = self.connections.get(addr) {
            return Ok(c.clone());
        }
        let url = format!("redis://:{}@{addr}/", self.password);
        let client = redis::Client::open(url)?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let connection = tokio::time::timeout(Duration::from_millis(500), connect)
            .await
            .map_err(|_| redis::RedisError::from(std::io::Error::other(format!("connect {addr} timed out"))))??;
        self.connections.insert(addr.to_owned(), connection.clone());
        Ok(connection)
    }

    /// Reloads the slot map from any node that answers `CLUSTER SLOTS`.
    pub async fn refresh(&mut self) {
        let mut candidates: Vec<String> = self.slots.iter().flatten().cloned().collect();
        candidates.sort();
        candidates.dedup();
        let seeds: Vec<String> = self.seeds.lock().unwrap().iter().map(|s| with_port(s)).collect();
        candidates.splice(0..0, seeds);
        for addr in candidates {
            let Ok(mut c) = self.connection(&addr).await else {
                self.connections.remove(&addr);
                continue;
            };
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SLOTS");
            let call = cmd.query_async::<Vec<Vec<redis::Value>>>(&mut c);
            let Ok(Ok(ranges)) = tokio::time::timeout(Duration::from_millis(500), call).await else {
                self.connections.remove(&addr);
                continue;
            };
            for range in ranges {
                let (Ok(start), Ok(end)) = (
                    redis::from_redis_value::<u16>(range[0].clone()),
                    redis::from_redis_value::<u16>(range[1].clone()),
                ) else {
                    continue;
                };
                let Ok(master) = redis::from_redis_value::<Vec<redis::Value>>(range[2].clone()) else { continue };
                let (Ok(ip), Ok(port)) = (
                    redis::from_redis_value::<String>(master[0].clone()),
                    redis::from_redis_value::<u16>(master[1].clone()),
                ) else {
                    continue;
                };
                for slot in start..=end {
                    self.slots[slot as usize] = Some(format!("{ip}:{port}"));
                }
            }
            return;
        }
    }

    /// Runs `commands` (after ASKING when asked to) where `key` lives.
    pub async fn routed<T: redis::FromRedisValue>(
        &mut self,
        key: &str,
        build: &(dyn Fn(&mut redis::Pipeline) + Sync),
    ) -> redis::RedisResult<T> {
        if std::mem::take(&mut self.stale) {
            self.refresh().await;
        }
        let first_seed = self.seeds.lock().unwrap().first().map(|s| with_port(s)).unwrap_or_default();
        let mut addr = self.slots[slot_of(key) as usize].clone().unwrap_or(first_seed);
        let mut asking = false;
        for _ in 0..6 {
            let mut pipe = redis::pipe();
            if asking {
                pipe.cmd("ASKING").ignore();
            }
            build(&mut pipe);
            let result = match self.connection(&addr).await {
                Ok(mut c) => {
                    tokio::time::timeout(Duration::from_secs(2), pipe.query_async::<T>(&mut c)).await.unwrap_or_else(
                        |_| Err(redis::RedisError::from(std::io::Error::other(format!("{addr} timed out")))),
                    )
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(value) => return Ok(value),
                Err(error) => match redirect(&error) {
                    Some(Redirect::Moved(to)) => {
                        self.slots[slot_of(key) as usize] = Some(to.clone());
                        (addr, asking) = (to, false);
                    }
                    Some(Redirect::Ask(to)) => (addr, asking) = (to, true),
                    None => {
                        // Not a redirect: this node is down or failing over.
                        // The write is simply not acknowledged; the next call
                        // starts from a fresh slot map.
                        if error.is_io_error() || error.is_timeout() || error.is_connection_dropped() {
                            self.connections.remove(&addr);
                        }
                        self.stale = true;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        return Err(error);
                    }
                },
            }
        }
        Err(redis::RedisError::from(std::io::Error::other("too many redirects")))
    }

    /// SET alone (a cluster without replicas): `Ok(false)`, accepted but
    /// acknowledged by no replica.
    pub async fn set(&mut self, key: &str, value: &str) -> redis::RedisResult<bool> {
        let build = |pipe: &mut redis::Pipeline| {
            pipe.cmd("SET").arg(key).arg(value).ignore();
        };
        let () = self.routed(key, &build).await?;
        Ok(false)
    }

    /// SET then `WAIT 1` on the same connection: `Ok(true)` when a replica has it.
    pub async fn set_acknowledged(&mut self, key: &str, value: &str) -> redis::RedisResult<bool> {
        let build = |pipe: &mut redis::Pipeline| {
            pipe.cmd("SET").arg(key).arg(value).ignore().cmd("WAIT").arg(1).arg(1000);
        };
        let (replicas,): (i64,) = self.routed(key, &build).await?;
        Ok(replicas >= 1)
    }

    pub async fn get(&mut self, key: &str) -> redis::RedisResult<Option<String>> {
        let build = |pipe: &mut redis::Pipeline| {
            pipe.cmd("GET").arg(key);
        };
        let (value,): (Option<String>,) = self.routed(key, &build).await?;
        Ok(value)
    }

    /// Writes `count` keys `prefix:<i>` = `<i>`, pipelined per master, then
    /// waits for a replica on every master. Returns the keys.
    pub async fn seed(&mut self, prefix: &str, count: usize) -> Vec<String> {
        let keys: Vec<String> = (0..count).map(|i| format!("{prefix}:{i}")).collect();
        let mut by_master: BTreeMap<String, Vec<&String>> = BTreeMap::new();
        for key in &keys {
            by_master.entry(self.slots[slot_of(key) as usize].clone().expect("slot map")).or_default().push(key);
        }
        for (addr, keys) in by_master {
            let mut c = self.connection(&addr).await.expect("master reachable");
            for chunk in keys.chunks(2000) {
                let mut pipe = redis::pipe();
                for key in chunk {
                    pipe.cmd("SET").arg(*key).arg(key.rsplit(':').next().unwrap()).ignore();
                }
                let () = pipe.query_async(&mut c).await.expect("seed write");
            }
            let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query_async(&mut c).await.expect("seed WAIT");
        }
        keys
    }
}

/// What a background writer saw.
#[derive(Default)]
pub struct Record {
    pub acknowledged: Vec<String>,
    /// When each acknowledged key was acknowledged, in order.
    pub acknowledged_at: Vec<Instant>,
    pub unacknowledged: usize,
    pub errors: usize,
    pub longest_gap: Duration,
    pub last_ack: Option<Instant>,
    /// When each write was accepted (SET answered OK, acknowledged by a
    /// replica or not), in order.
    pub accepted_at: Vec<Instant>,
    /// The first errors (at most [`ERRORS_KEPT`]), when and what, to explain a pause.
    pub error_log: Vec<(Instant, String)>,
}

const ERRORS_KEPT: usize = 100;

/// Writes unique keys until stopped; see [`Record`].
pub struct Writer {
    pub record: Arc<Mutex<Record>>,
    seeds: Arc<Mutex<Vec<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    pub async fn start(seeds: Vec<String>, password: &str, prefix: &str) -> Self {
        Self::start_within(seeds, password, prefix, None).await
    }

    /// A writer of keys in `slots` only (one shard's), so a stall of another
    /// shard does not hold it up.
    pub async fn start_within(
        seeds: Vec<String>,
        password: &str,
        prefix: &str,
        slots: Option<std::collections::BTreeSet<u16>>,
    ) -> Self {
        Self::spawn(seeds, password, prefix, slots, true).await
    }

    /// [`Writer::start_within`] for a cluster without replicas: SET alone,
    /// no `WAIT 1` (which would hold every write for its whole timeout).
    #[allow(dead_code)] // the reshard bench's
    pub async fn start_unreplicated_within(
        seeds: Vec<String>,
        password: &str,
        prefix: &str,
        slots: Option<std::collections::BTreeSet<u16>>,
    ) -> Self {
        Self::spawn(seeds, password, prefix, slots, false).await
    }

    async fn spawn(
        seeds: Vec<String>,
        password: &str,
        prefix: &str,
        slots: Option<std::collections::BTreeSet<u16>>,
        replicated: bool,
    ) -> Self {
        let mut client = ClusterClient::new(seeds, password).await;
        let shared_seeds = client.seeds.clone();
        let record = Arc::new(Mutex::new(Record::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (r, s, prefix) = (record.clone(), stop.clone(), prefix.to_owned());
        let task = tokio::spawn(async move {
            let mut i = 0u64;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("{prefix}:{i}");
                i += 1;
                if slots.as_ref().is_some_and(|slots| !slots.contains(&slot_of(&key))) {
                    continue;
                }
                let result = if replicated {
                    client.set_acknowledged(&key, &i.to_string()).await
                } else {
                    client.set(&key, &i.to_string()).await
                };
                {
                    let mut rec = r.lock().unwrap();
                    if result.is_ok() {
                        rec.accepted_at.push(Instant::now());
                    }
                    match result {
                        Ok(true) => {
                            let now = Instant::now();
                            if let Some(last) = rec.last_ack {
                                rec.longest_gap = rec.longest_gap.max(now - last);
                            }
                            rec.last_ack = Some(now);
                            rec.acknowledged.push(key);
                            rec.acknowledged_at.push(now);
                        }
                        Ok(false) => rec.unacknowledged += 1,
                        Err(error) => {
                            rec.errors += 1;
                            if rec.error_log.len() < ERRORS_KEPT {
                                rec.error_log.push((Instant::now(), error.to_string()));
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Self { record, seeds: shared_seeds, stop, task }
    }

    /// Points the writer at new addresses (every Pod was recreated).
    pub fn reseed(&self, seeds: Vec<String>) {
        *self.seeds.lock().unwrap() = seeds;
    }

    /// The addresses the writer starts from, to follow Pods as they move.
    #[allow(dead_code)] // not every test binary moves Pods
    pub fn seeds_handle(&self) -> Arc<Mutex<Vec<String>>> {
        self.seeds.clone()
    }

    /// The longest gap so far, and resets it (a phase starts).
    pub fn take_gap(&self) -> Duration {
        std::mem::take(&mut self.record.lock().unwrap().longest_gap)
    }

    pub async fn stop(self) -> Record {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
        Arc::try_unwrap(self.record).ok().expect("writer stopped").into_inner().unwrap()
    }

    /// The longest interval between acknowledgements of keys in `slots`
    /// (one shard's), from `since` to now.
    pub fn gap_within(&self, slots: &std::collections::BTreeSet<u16>, since: Instant) -> Duration {
        let rec = self.record.lock().unwrap();
        let mut last = since;
        let mut longest = Duration::ZERO;
        for (key, at) in rec.acknowledged.iter().zip(&rec.acknowledged_at) {
            if *at < since || !slots.contains(&slot_of(key)) {
                continue;
            }
            longest = longest.max(*at - last);
            last = *at;
        }
        longest.max(Instant::now() - last)
    }

    /// The longest interval without an accepted write, from `since` to the
    /// last accepted write (so a stall still going on is not counted yet),
    /// and whether any write was accepted after it.
    pub fn accept_gap(&self, since: Instant) -> (Duration, bool) {
        let (longest, _, last) = self.accept_gaps(since);
        (longest, last > since)
    }

    /// [`Self::accept_gap`]'s interval, and when it began.
    pub fn longest_accept_gap(&self, since: Instant) -> (Duration, Instant) {
        let (longest, began, _) = self.accept_gaps(since);
        (longest, began)
    }

    /// The longest interval between accepted writes from `since`, when it
    /// began, and the last accepted write (`since` if none).
    fn accept_gaps(&self, since: Instant) -> (Duration, Instant, Instant) {
        let rec = self.record.lock().unwrap();
        let (mut last, mut longest, mut began) = (since, Duration::ZERO, since);
        for &at in rec.accepted_at.iter().filter(|at| **at >= since) {
            if at - last > longest {
                (longest, began) = (at - last, last);
            }
            last = at;
        }
        (longest, began, last)
    }

    pub fn snapshot(&self) -> Vec<String> {
        self.record.lock().unwrap().acknowledged.clone()
    }
}

/// Asserts that every seeded key (offset 0) and every key `writer` has had
/// acknowledged so far (offset 1) reads back, naming `step` and a few lost keys.
pub async fn assert_all_read_back(client: &mut ClusterClient, seeds: &[String], writer: &Writer, step: &str) {
    assert_none_lost(client, seeds, 0, &format!("{step}: seeded")).await;
    let acknowledged = writer.snapshot();
    let lost = missing(client, &acknowledged, 1).await;
    if !lost.is_empty() {
        describe_lost(client, writer, &lost);
    }
    assert_none_lost(client, &acknowledged, 1, &format!("{step}: acknowledged")).await;
    eprintln!("{step}: all {} seeded and {} acknowledged keys read back", seeds.len(), acknowledged.len());
}

/// Seeded (`seed:` keys, value offset 0) and acknowledged (offset 1) keys
/// still missing after up to 20 s: a node may still be loading its data, so
/// a key counts as lost only if it stays missing.
pub async fn lost_after_settling(
    client: &mut ClusterClient,
    seeded: &[String],
    acknowledged: &[String],
) -> Vec<String> {
    let mut lost = missing(client, seeded, 0).await;
    lost.extend(missing(client, acknowledged, 1).await);
    for _ in 0..10 {
        if lost.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let keys: Vec<String> = lost.iter().map(|m| m.split(':').take(2).collect::<Vec<_>>().join(":")).collect();
        let (seeded, acked): (Vec<String>, Vec<String>) = keys.into_iter().partition(|k| k.starts_with("seed:"));
        lost = missing(client, &seeded, 0).await;
        lost.extend(missing(client, &acked, 1).await);
    }
    lost
}

/// Prints, for each lost key, when it was acknowledged (Unix time, to line
/// up with the operator's and Redis's logs) and where its slot lives now.
fn describe_lost(client: &ClusterClient, writer: &Writer, lost: &[String]) {
    let rec = writer.record.lock().unwrap();
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    for entry in lost.iter().take(5) {
        let key = entry.split(':').take(2).collect::<Vec<_>>().join(":");
        let Some(i) = rec.acknowledged.iter().position(|k| *k == key) else { continue };
        let at = wall - (now - rec.acknowledged_at[i]);
        let unix = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        let slot = slot_of(&key);
        let owner = client.slots[slot as usize].clone().unwrap_or_default();
        eprintln!("lost {key}: acknowledged at unix {unix:.3} (ack #{i}), slot {slot}, now served by {owner}");
    }
}

/// Asserts that [`missing`] finds nothing, naming `what` and a few lost keys.
/// A key that could not be read (an error, such as MOVED back and forth
/// while the nodes' views of a just-moved slot converge) is read again for
/// up to 5 s; a key read with a wrong or no value counts at once.
pub async fn assert_none_lost(client: &mut ClusterClient, keys: &[String], offset: u64, what: &str) {
    let mut lost = missing(client, keys, offset).await;
    for _ in 0..5 {
        if lost.is_empty() || !lost.iter().all(|l| l.contains(": Err(")) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let unread: Vec<String> = lost.iter().map(|m| m.split(':').take(2).collect::<Vec<_>>().join(":")).collect();
        lost = missing(client, &unread, offset).await;
    }
    assert!(
        lost.is_empty(),
        "{what}: {} of {} keys lost, e.g. {:?}",
        lost.len(),
        keys.len(),
        &lost[..lost.len().min(5)]
    );
}

/// Every key reads back with the value it was written with (`<prefix>:<i>`
/// holds `<i + offset>`); returns what did not. Pipelined per master, with
/// a routed GET for any key whose slot moved.
pub async fn missing(client: &mut ClusterClient, keys: &[String], offset: u64) -> Vec<String> {
    client.refresh().await;
    let expected = |key: &str| (key.rsplit(':').next().unwrap().parse::<u64>().unwrap() + offset).to_string();
    let mut by_master: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for key in keys {
        by_master.entry(client.slots[slot_of(key) as usize].clone().unwrap_or_default()).or_default().push(key);
    }
    let mut retry = Vec::new();
    for (addr, keys) in by_master {
        let Ok(mut c) = client.connection(&addr).await else {
            retry.extend(keys);
            continue;
        };
        for chunk in keys.chunks(2000) {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for key in chunk {
                pipe.cmd("GET").arg(*key);
            }
            match pipe.query_async::<Vec<redis::Value>>(&mut c).await {
                Ok(values) => {
                    for (key, value) in chunk.iter().zip(values) {
                        let ok = redis::from_redis_value::<Option<String>>(value).ok().flatten() == Some(expected(key));
                        if !ok {
                            retry.push(key);
                        }
                    }
                }
                Err(_) => retry.extend(chunk),
            }
        }
    }
    let mut missing = Vec::new();
    for key in retry {
        // An error is a read that failed, not a key lost: a connection kept
        // from before a crash answers `broken pipe` once, and is dropped.
        let mut outcome = client.get(key).await;
        for _ in 0..3 {
            if outcome.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            outcome = client.get(key).await;
        }
        match outcome {
            Ok(Some(v)) if v == expected(key) => {}
            other => missing.push(format!("{key}: {other:?}")),
        }
    }
    missing
}
