//! Parallel layout: rank -> (tp, cp, dp, pp) coordinates in a rank order ([`Order`]; default
//! Megatron's `tp-cp-ep-dp-pp`: tp fastest, then cp, then dp, then pp), expert-parallel groups
//! inside dp, and the communication groups of each role.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Communication group roles (as injected into comm names and written to `truth.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Tp,
    Cp,
    Dp,
    Pp,
    Ep,
    Global,
}

impl Role {
    /// Every role, in the order groups are created on each rank.
    pub const ALL: [Role; 6] = [
        Role::Tp,
        Role::Cp,
        Role::Dp,
        Role::Pp,
        Role::Ep,
        Role::Global,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Tp => "tp",
            Role::Cp => "cp",
            Role::Dp => "dp",
            Role::Pp => "pp",
            Role::Ep => "ep",
            Role::Global => "global",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The four dimensions that number the ranks (EP groups live inside `dp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Tensor parallel.
    Tp,
    /// Context parallel.
    Cp,
    /// Data parallel (EP groups are blocks of it).
    Dp,
    /// Pipeline parallel.
    Pp,
}

impl Dim {
    /// `"tp"`, `"cp"`, `"dp"`, `"pp"`.
    pub fn name(self) -> &'static str {
        match self {
            Dim::Tp => "tp",
            Dim::Cp => "cp",
            Dim::Dp => "dp",
            Dim::Pp => "pp",
        }
    }
}

/// Rank order, fastest-varying dimension first, written like Megatron-core's `order` argument
/// (`"tp-cp-ep-dp-pp"`): a permutation of `tp`, `cp`, `dp`, `pp`, optionally with one `ep`.
/// Megatron writes `ep` into its orders (`tp-cp-ep-dp-pp`, `tp-cp-ep-pp-dp` for
/// `--use-tp-pp-dp-mapping`); here its place does not change the numbering: EP groups are always
/// blocks of `ep` consecutive dp indices with the same other coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Order {
    /// The dimensions, fastest first.
    pub dims: [Dim; 4],
    /// Where `ep` was written (index into the written list), for display.
    ep_at: Option<u8>,
}

/// Megatron-core's default order.
pub const MEGATRON_ORDER: &str = "tp-cp-ep-dp-pp";

impl Order {
    /// Megatron-core's default order, `tp-cp-ep-dp-pp`.
    pub const MEGATRON: Order = Order {
        dims: [Dim::Tp, Dim::Cp, Dim::Dp, Dim::Pp],
        ep_at: Some(2),
    };
}

impl Default for Order {
    fn default() -> Self {
        Order::MEGATRON
    }
}

impl FromStr for Order {
    type Err = String;

    fn from_str(s: &str) -> Result<Order, String> {
        let bad = |why: &str| {
            format!("bad order {s:?}: {why}; write a permutation of tp, cp, dp, pp joined by `-`, fastest first, optionally with ep (e.g. \"{MEGATRON_ORDER}\")")
        };
        let mut dims = Vec::new();
        let mut ep_at = None;
        for (i, w) in s.split('-').map(str::trim).enumerate() {
            let d = match w.to_ascii_lowercase().as_str() {
                "tp" => Dim::Tp,
                "cp" => Dim::Cp,
                "dp" => Dim::Dp,
                "pp" => Dim::Pp,
                "ep" if ep_at.is_none() => {
                    ep_at = Some(i as u8);
                    continue;
                }
                "ep" => return Err(bad("ep appears twice")),
                _ => return Err(bad(&format!("unknown dimension {w:?}"))),
            };
            if dims.contains(&d) {
                return Err(bad(&format!("{} appears twice", d.name())));
            }
            dims.push(d);
        }
        let dims: [Dim; 4] = dims
            .try_into()
            .map_err(|_| bad("each of tp, cp, dp, pp must appear once"))?;
        Ok(Order { dims, ep_at })
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words: Vec<&str> = self.dims.iter().map(|d| d.name()).collect();
        if let Some(i) = self.ep_at {
            words.insert(usize::from(i).min(words.len()), "ep");
        }
        f.write_str(&words.join("-"))
    }
}

impl TryFrom<String> for Order {
    type Error = String;
    /// As [`str::parse`].
    fn try_from(s: String) -> Result<Order, String> {
        s.parse()
    }
}

impl From<Order> for String {
    fn from(o: Order) -> String {
        o.to_string()
    }
}

/// Sizes of each parallel dimension and the rank order. `ep` divides `dp`; world = tp * cp * dp * pp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
    pub ep: usize,
    /// Rank order (fastest first); absent in older truth files = Megatron's.
    #[serde(default)]
    pub order: Order,
}

impl Default for Layout {
    /// One rank, Megatron order.
    fn default() -> Self {
        Layout::new(1, 1, 1, 1, 1)
    }
}

/// A rank's position in every dimension (`ep` = index inside its EP group, `ep_group` = which one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coords {
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
    pub ep: usize,
    pub ep_group: usize,
}

/// One communicator: its role, a stable name (used as `commName` and as its key) and its members
/// in communicator-rank order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub role: Role,
    pub name: String,
    pub ranks: Vec<usize>,
}

impl Group {
    /// Communicator rank of a global rank (None when not a member).
    pub fn comm_rank(&self, rank: usize) -> Option<usize> {
        self.ranks.iter().position(|r| *r == rank)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LayoutError {
    #[error("every layout dimension must be >= 1 (got tp={tp} cp={cp} dp={dp} pp={pp} ep={ep})")]
    Zero {
        tp: usize,
        cp: usize,
        dp: usize,
        pp: usize,
        ep: usize,
    },
    #[error("ep={ep} must divide dp={dp}")]
    EpDoesNotDivideDp { ep: usize, dp: usize },
    #[error("cannot rescale to {ranks} ranks: must be a multiple of tp*cp*pp = {unit} (and dp = ranks/{unit} a multiple of ep={ep})")]
    Rescale {
        ranks: usize,
        unit: usize,
        ep: usize,
    },
    #[error("cannot spread {ranks} ranks over {hosts} hosts: ranks must be a multiple of hosts")]
    Hosts { ranks: usize, hosts: usize },
}

impl Layout {
    /// A layout in Megatron order.
    pub const fn new(tp: usize, cp: usize, dp: usize, pp: usize, ep: usize) -> Layout {
        Layout {
            tp,
            cp,
            dp,
            pp,
            ep,
            order: Order::MEGATRON,
        }
    }

    /// The same layout with rank order `order`.
    pub fn with_order(self, order: Order) -> Layout {
        Layout { order, ..self }
    }

    /// Size of dimension `d`.
    pub fn dim_size(&self, d: Dim) -> usize {
        match d {
            Dim::Tp => self.tp,
            Dim::Cp => self.cp,
            Dim::Dp => self.dp,
            Dim::Pp => self.pp,
        }
    }

    /// Rank distance between neighbours along `d` (product of the faster dimensions' sizes).
    pub fn stride(&self, d: Dim) -> usize {
        self.order
            .dims
            .iter()
            .take_while(|x| **x != d)
            .map(|x| self.dim_size(*x))
            .product()
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.tp * self.cp * self.dp * self.pp
    }

    pub fn validate(&self) -> Result<(), LayoutError> {
        let Layout {
            tp, cp, dp, pp, ep, ..
        } = *self;
        if [tp, cp, dp, pp, ep].contains(&0) {
            return Err(LayoutError::Zero { tp, cp, dp, pp, ep });
        }
        if dp % ep != 0 {
            return Err(LayoutError::EpDoesNotDivideDp { ep, dp });
        }
        Ok(())
    }

    /// The same layout with `dp` scaled so that world = `ranks`.
    pub fn rescaled(&self, ranks: usize) -> Result<Layout, LayoutError> {
        let unit = self.tp * self.cp * self.pp;
        let err = LayoutError::Rescale {
            ranks,
            unit,
            ep: self.ep,
        };
        if ranks == 0 || unit == 0 || !ranks.is_multiple_of(unit) {
            return Err(err);
        }
        let l = Layout {
            dp: ranks / unit,
            ..*self
        };
        l.validate().map_err(|_| err)?;
        Ok(l)
    }

    /// Coordinates of `rank` (< world) in the layout's order.
    pub fn coords(&self, rank: usize) -> Coords {
        let at = |d: Dim| (rank / self.stride(d)) % self.dim_size(d);
        let (tp, cp, dp, pp) = (at(Dim::Tp), at(Dim::Cp), at(Dim::Dp), at(Dim::Pp));
        Coords {
            tp,
            cp,
            dp,
            pp,
            ep: dp % self.ep,
            ep_group: dp / self.ep,
        }
    }

    /// The rank at these coordinates.
    pub fn rank_of(&self, tp: usize, cp: usize, dp: usize, pp: usize) -> usize {
        tp * self.stride(Dim::Tp)
            + cp * self.stride(Dim::Cp)
            + dp * self.stride(Dim::Dp)
            + pp * self.stride(Dim::Pp)
    }

    fn suffix_cp(&self, c: &Coords) -> String {
        if self.cp > 1 {
            format!("_cp{}", c.cp)
        } else {
            String::new()
        }
    }

    /// The group of `role` that `rank` belongs to (members in communicator-rank order).
    pub fn group_of(&self, rank: usize, role: Role) -> Group {
        let c = self.coords(rank);
        let (name, ranks): (String, Vec<usize>) = match role {
            Role::Tp => (
                format!("tp:pp{}_dp{}{}", c.pp, c.dp, self.suffix_cp(&c)),
                (0..self.tp)
                    .map(|t| self.rank_of(t, c.cp, c.dp, c.pp))
                    .collect(),
            ),
            Role::Cp => (
                format!("cp:pp{}_dp{}_tp{}", c.pp, c.dp, c.tp),
                (0..self.cp)
                    .map(|x| self.rank_of(c.tp, x, c.dp, c.pp))
                    .collect(),
            ),
            Role::Dp => (
                format!("dp:pp{}_tp{}{}", c.pp, c.tp, self.suffix_cp(&c)),
                (0..self.dp)
                    .map(|d| self.rank_of(c.tp, c.cp, d, c.pp))
                    .collect(),
            ),
            Role::Pp => (
                format!("pp:dp{}_tp{}{}", c.dp, c.tp, self.suffix_cp(&c)),
                (0..self.pp)
                    .map(|p| self.rank_of(c.tp, c.cp, c.dp, p))
                    .collect(),
            ),
            Role::Ep => (
                format!(
                    "ep:pp{}_tp{}_g{}{}",
                    c.pp,
                    c.tp,
                    c.ep_group,
                    self.suffix_cp(&c)
                ),
                (0..self.ep)
                    .map(|e| self.rank_of(c.tp, c.cp, c.ep_group * self.ep + e, c.pp))
                    .collect(),
            ),
            Role::Global => ("global:world".to_string(), (0..self.world()).collect()),
        };
        Group { role, name, ranks }
    }

    /// Size of the groups of `role`.
    pub fn size(&self, role: Role) -> usize {
        match role {
            Role::Tp => self.tp,
            Role::Cp => self.cp,
            Role::Dp => self.dp,
            Role::Pp => self.pp,
            Role::Ep => self.ep,
            Role::Global => self.world(),
        }
    }

    /// Roles that get a communicator: groups of more than one rank, and always `global`.
    pub fn active_roles(&self) -> Vec<Role> {
        Role::ALL
            .into_iter()
            .filter(|r| *r == Role::Global || self.size(*r) > 1)
            .collect()
    }

    /// Every group of the active roles, each once, in role order then by lowest member.
    pub fn all_groups(&self) -> Vec<Group> {
        let mut out = Vec::new();
        for role in self.active_roles() {
            let mut seen = std::collections::BTreeMap::new();
            for r in 0..self.world() {
                let g = self.group_of(r, role);
                seen.entry(g.ranks[0]).or_insert(g);
            }
            out.extend(seen.into_values());
        }
        out
    }
}

/// Host index of `rank` when `ranks` are spread evenly (in blocks) over `hosts`.
pub fn host_of(rank: usize, ranks: usize, hosts: usize) -> usize {
    rank / (ranks / hosts.max(1)).max(1)
}

/// Check that `ranks` spread evenly over `hosts`.
pub fn check_hosts(ranks: usize, hosts: usize) -> Result<(), LayoutError> {
    if hosts == 0 || !ranks.is_multiple_of(hosts) {
        return Err(LayoutError::Hosts { ranks, hosts });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
