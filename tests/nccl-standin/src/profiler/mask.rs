//! NCCL's activation rules: an event is emitted if its bit or any descendant's bit is set
//! (the masks below are NCCL 2.30's `src/plugin/profiler.cc` conditions).

use super::abi::bits::*;

/// GroupApi (outermost group only).
pub fn group_api(m: i32) -> bool {
    m & (GROUP_API
        | P2P_API
        | COLL_API
        | KERNEL_LAUNCH
        | GROUP
        | COLL
        | P2P
        | PROXY_OP
        | PROXY_STEP
        | KERNEL_CH
        | NET_PLUGIN
        | CE_ALL)
        != 0
}
/// CollApi.
pub fn coll_api(m: i32) -> bool {
    m & (COLL_API | COLL | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN | CE_ALL) != 0
}
/// P2pApi.
pub fn p2p_api(m: i32) -> bool {
    m & (P2P_API | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
}
/// KernelLaunch.
pub fn kernel_launch(m: i32) -> bool {
    m & KERNEL_LAUNCH != 0
}
/// Group.
pub fn group(m: i32) -> bool {
    m & (GROUP | COLL | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
}
/// Coll.
pub fn coll(m: i32) -> bool {
    m & (COLL | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
}
/// P2p.
pub fn p2p(m: i32) -> bool {
    m & (P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
}
/// KernelCh.
pub fn kernel_ch(m: i32) -> bool {
    m & KERNEL_CH != 0
}
/// ProxyOp.
pub fn proxy_op(m: i32) -> bool {
    m & (PROXY_OP | PROXY_STEP | NET_PLUGIN) != 0
}
/// ProxyStep.
pub fn proxy_step(m: i32) -> bool {
    m & (PROXY_STEP | NET_PLUGIN) != 0
}
/// NetPlugin.
pub fn net_plugin(m: i32) -> bool {
    m & NET_PLUGIN != 0
}
/// ProxyCtrl.
pub fn proxy_ctrl(m: i32) -> bool {
    m & PROXY_CTRL != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_ch_alone_implies_its_ancestors() {
        let m = KERNEL_CH;
        assert!(
            group_api(m)
                && coll_api(m)
                && p2p_api(m)
                && group(m)
                && coll(m)
                && p2p(m)
                && kernel_ch(m)
        );
        assert!(!proxy_op(m) && !kernel_launch(m) && !proxy_ctrl(m));
    }

    #[test]
    fn net_plugin_implies_proxy_events() {
        assert!(proxy_op(NET_PLUGIN) && proxy_step(NET_PLUGIN) && coll(NET_PLUGIN));
        assert!(!kernel_ch(NET_PLUGIN));
    }
}
