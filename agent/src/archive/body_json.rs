//! `body_json`: the wire JSON rendering of a record (`comminsight_wire::json::to_value`,
//! serialized compactly) for the kinds whose fields have no Parquet columns (proc_start,
//! comm_init, comm_fini, proxy, net, overdue, stats). `coll` / `p2p` rows, the bulk of every
//! segment, are fully described by their columns and carry no JSON.

use comminsight_wire::json;
use comminsight_wire::record::Record;

/// Append the JSON rendering of `rec` to `buf`.
pub(crate) fn render(rec: &Record, buf: &mut Vec<u8>) {
    serde_json::to_writer(&mut *buf, &serde_json::Value::Object(json::to_value(rec)))
        .expect("writing JSON to a Vec cannot fail");
}
