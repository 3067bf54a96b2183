//! Serde for maps whose keys are not strings (JSON object keys must be strings): a map is
//! written as a list of `[key, value]` pairs, in key order.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(
    m: &BTreeMap<K, V>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(m.iter())
}

pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
where
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
    D: Deserializer<'de>,
{
    let v: Vec<(K, V)> = Vec::deserialize(d)?;
    Ok(v.into_iter().collect())
}

/// The same for a `HashMap`, written sorted by key so that equal maps serialize equally.
pub mod hash {
    use super::*;

    pub fn serialize<K: Serialize + Ord, V: Serialize, S: Serializer>(
        m: &HashMap<K, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut v: Vec<(&K, &V)> = m.iter().collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        s.collect_seq(v)
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<HashMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Eq + Hash,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let v: Vec<(K, V)> = Vec::deserialize(d)?;
        Ok(v.into_iter().collect())
    }
}
