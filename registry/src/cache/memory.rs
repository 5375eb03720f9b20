//! The in-memory tier: a bounded LRU of loaded executables, keyed by (key, client).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::key::CacheKey;
use crate::pjrt::{Client, LoadedExecutable};

/// Identifies a client while one of its executables is cached: every cached executable holds its
/// client alive, so the client's address cannot be reused by another client meanwhile.
pub(crate) type ClientId = usize;

pub(crate) fn client_id(client: &Client) -> ClientId {
    Arc::as_ptr(&client.inner) as usize
}

/// The memory tier's key: executables are per client.
pub(crate) type MemKey = (CacheKey, ClientId);

/// A least-recently-used map with O(log n) touch and eviction.
#[derive(Debug)]
pub(crate) struct Lru {
    capacity: usize,
    tick: u64,
    entries: HashMap<MemKey, (Arc<LoadedExecutable>, u64)>,
    order: BTreeMap<u64, MemKey>,
}

impl Lru {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { capacity, tick: 0, entries: HashMap::new(), order: BTreeMap::new() }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The executable for (`key`, `client`), marked most recently used.
    pub(crate) fn get(&mut self, key: &CacheKey, client: &Client) -> Option<Arc<LoadedExecutable>> {
        let mk = (*key, client_id(client));
        let tick = self.next_tick();
        let (exe, used) = self.entries.get_mut(&mk)?;
        // Belt and braces: the entry's executable must belong to this very client.
        if !Arc::ptr_eq(&exe.client().inner, &client.inner) {
            return None;
        }
        self.order.remove(used);
        *used = tick;
        self.order.insert(tick, mk);
        Some(exe.clone())
    }

    /// Inserts (or replaces) an entry; returns how many entries were evicted to make room.
    pub(crate) fn insert(
        &mut self,
        key: CacheKey,
        client: &Client,
        exe: Arc<LoadedExecutable>,
    ) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let mk = (key, client_id(client));
        let tick = self.next_tick();
        if let Some((_, old)) = self.entries.insert(mk, (exe, tick)) {
            self.order.remove(&old);
        }
        self.order.insert(tick, mk);
        let mut evicted = 0;
        while self.entries.len() > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.entries.remove(&oldest);
            evicted += 1;
        }
        evicted
    }

    /// Drops the entry for (`key`, `client`), if any.
    pub(crate) fn remove(&mut self, key: &CacheKey, client: &Client) -> bool {
        match self.entries.remove(&(*key, client_id(client))) {
            Some((_, used)) => {
                self.order.remove(&used);
                true
            }
            None => false,
        }
    }

    /// Drops every entry of `client` (letting the client be freed); returns how many.
    pub(crate) fn remove_client(&mut self, client: &Client) -> usize {
        let id = client_id(client);
        let before = self.entries.len();
        self.entries.retain(|(_, c), _| *c != id);
        let entries = &self.entries;
        self.order.retain(|_, mk| entries.contains_key(mk));
        before - self.entries.len()
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
