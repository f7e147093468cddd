//! Routing keeps authorisation: the permission matrix of
//! `tests/permissions.rs` (one table, `tests/common/permission_matrix.rs`) run
//! through a node of a three-node cluster that owns neither dataset, so that
//! every dataset request is forwarded with its `Authorization` and authorised by
//! the owner, and every other request (create, list, accountant, cluster map) is
//! answered by the node itself: the same answers as one node gives.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
#[path = "common/permission_matrix.rs"]
mod permission_matrix;

use cluster::*;
use dpledger::api::permissions::role_name;
use permission_matrix::check_permission_matrix;
use std::time::Duration;

#[test]
fn the_permission_table_holds_through_a_non_owner_node() {
    let Some(cluster) = Cluster::start(3, 2000) else {
        return;
    };
    cluster.create(0, "d", 20, 0.5);
    cluster.create(1, "other", 20, 0.5);
    let bound = Duration::from_secs(20);
    let owners = [
        cluster.wait_owner("d", None, bound).0,
        cluster.wait_owner("other", None, bound).0,
    ];
    let via = cluster
        .nodes
        .iter()
        .find(|n| !owners.contains(&n.id))
        .expect("a node that owns neither dataset");
    let admin = cluster.admin_token();
    let token_of = |role| match role_name(role) {
        "admin" => admin.clone(),
        "metrics" => cluster.token("metrics", None, None),
        "owner" => cluster.token("owner", Some("d"), Some("3")),
        name => cluster.token(name, Some("d"), None),
    };
    let before = forwarded(&via.url, &admin);
    let checked = check_permission_matrix(&via.url, &token_of, &admin);
    let after = forwarded(&via.url, &admin);
    // Every authorised-or-not dataset request went to the owner: at least one
    // forward per role and endpoint on a dataset.
    assert!(
        after - before >= 100.0,
        "{} forwarded {}",
        via.id,
        after - before
    );
    eprintln!(
        "{checked} requests through {}, {} forwarded",
        via.id,
        after - before
    );
}
