//! The IP addresses of this machine's network interfaces (`getifaddrs`), which RoCE GID
//! selection matches against: a RoCE v2 GID is only useful when it carries an address its
//! netdev really has.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InterfaceAddress {
    /// Interface name, e.g. `ens1f0np0`.
    pub interface: String,
    /// The address.
    pub addr: IpAddr,
}

/// Every IPv4 and IPv6 address of every interface of the running machine.
pub fn interface_addresses() -> Result<Vec<InterfaceAddress>, std::io::Error> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success it owns a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` is non-null and points to at least a `sockaddr`.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says the storage is a `sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage is a `sockaddr_in6`.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        out.push(InterfaceAddress {
            interface: name,
            addr,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_127_0_0_1_when_listed() {
        let addrs = interface_addresses().unwrap();
        if let Some(lo) = addrs
            .iter()
            .find(|a| a.interface == "lo" && a.addr.is_ipv4())
        {
            assert_eq!(lo.addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
    }
}
