#include "common/udp_batch.h"

#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/sys_check.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

namespace thc {

namespace {
constexpr size_t kMaxMsgs = 64;           // messages per sendmmsg/recvmmsg
constexpr size_t kMaxSegments = 64;       // datagrams per GSO buffer (UDP_MAX_SEGMENTS on old kernels)
constexpr size_t kMaxGsoBytes = 63 * 1024;
constexpr size_t kGroBuffer = 65536;      // one coalesced GRO buffer
constexpr size_t kPlainBuffer = 9216;     // one datagram, GRO off
}  // namespace

UdpBatch::UdpBatch(int fd, bool connected, bool gso, bool gro) : fd_(fd), connected_(connected) {
  if (gso) {
    // Probe: a socket-wide segment size of 0 turns GSO off again but is refused where the
    // kernel has no UDP_SEGMENT at all.
    int zero = 0;
    gso_ = THC_SYS(::setsockopt(fd_, SOL_UDP, UDP_SEGMENT, &zero, sizeof zero)).ok();
  }
  if (gro) {
    int one = 1;
    gro_ = THC_SYS(::setsockopt(fd_, SOL_UDP, UDP_GRO, &one, sizeof one)).ok();
  }
}

void UdpBatch::queue(const PeerAddr& to, const uint8_t* data, size_t len) {
  const size_t off = obuf_.size();
  obuf_.insert(obuf_.end(), data, data + len);
  out_.push_back(Out{connected_ ? PeerAddr{} : to, off, len});
}

void UdpBatch::queue_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen) {
  const size_t off = obuf_.size();
  obuf_.insert(obuf_.end(), head, head + hlen);
  out_.push_back(Out{connected_ ? PeerAddr{} : to, off, hlen, tlen ? tail : nullptr, tlen});
}

void UdpBatch::send_messages(std::vector<mmsghdr>& msgs, const std::vector<MsgDgrams>& meta, size_t count) {
  size_t done = 0;
  while (done < count) {
    const sys::SysResult r =
        THC_SYS(::sendmmsg(fd_, msgs.data() + done, static_cast<unsigned>(count - done), MSG_DONTWAIT));
    st_.send_calls++;
    if (r.ok() && r.rc > 0) {
      for (size_t i = 0; i < static_cast<size_t>(r.rc); ++i) {
        const size_t nd = meta[done + i].datagrams;
        st_.datagrams_sent += nd;
        if (nd > 1) {
          st_.gso_buffers++;
          st_.gso_datagrams += nd;
        }
      }
      done += static_cast<size_t>(r.rc);
      continue;
    }
    // The message at `done` failed. A GSO buffer the device cannot take (EIO: no checksum
    // offload; EINVAL) is resent datagram by datagram and GSO is given up; anything else (full
    // buffer, an unreachable peer) loses it, as UDP does.
    msghdr& h = msgs[done].msg_hdr;
    const MsgDgrams& md = meta[done];
    st_.last_errno = r.err;
    if (md.datagrams > 1 && (r.err == EIO || r.err == EINVAL || r.err == EMSGSIZE)) {
      gso_ = false;
      // A datagram is one iovec, or two (queue_parts); the datagrams of a GSO run have equal size.
      const size_t per = h.msg_iovlen / md.datagrams;
      for (size_t i = 0; i < md.datagrams; ++i) {
        msghdr one{};
        one.msg_name = h.msg_name;
        one.msg_namelen = h.msg_namelen;
        one.msg_iov = &h.msg_iov[i * per];
        one.msg_iovlen = per;
        const sys::SysResult r1 = THC_SYS(::sendmsg(fd_, &one, MSG_DONTWAIT));
        st_.send_calls++;
        if (r1.ok()) {
          st_.datagrams_sent++;
        } else {
          st_.send_errors++;
          st_.last_errno = r1.err;
        }
      }
    } else {
      st_.send_errors += md.datagrams;
    }
    ++done;
  }
}

void UdpBatch::flush() {
  if (out_.empty()) return;
  // Group by destination (stable): few destinations per flush (the workers of a job).
  std::vector<size_t>& order = order_;
  order.clear();
  if (connected_) {
    for (size_t i = 0; i < out_.size(); ++i) order.push_back(i);
  } else {
    std::vector<char>& taken = taken_;
    taken.assign(out_.size(), 0);
    for (size_t i = 0; i < out_.size(); ++i) {
      if (taken[i]) continue;
      for (size_t k = i; k < out_.size(); ++k)
        if (!taken[k] && out_[k].to == out_[i].to) {
          taken[k] = 1;
          order.push_back(k);
        }
    }
  }
  // Reserved up front: messages point into it.
  std::vector<iovec>& iov = iov_;
  iov.clear();
  iov.reserve(2 * order.size());
  std::vector<mmsghdr> msgs;
  std::vector<MsgDgrams> meta;
  msgs.reserve(kMaxMsgs);
  meta.reserve(kMaxMsgs);
  const size_t cspace = CMSG_SPACE(sizeof(uint16_t));
  std::vector<uint8_t> ctl(kMaxMsgs * cspace, 0);
  size_t i = 0;
  while (i < order.size()) {
    const Out& first = out_[order[i]];
    // A run: same destination, same size (a GSO buffer's segments are equal but the last),
    // one or two parts alike, within the GSO limits.
    size_t n = 1;
    if (gso_) {
      while (i + n < order.size() && n < kMaxSegments && (n + 1) * first.size() <= kMaxGsoBytes) {
        const Out& o = out_[order[i + n]];
        if (o.size() != first.size() || (o.tail != nullptr) != (first.tail != nullptr) ||
            !(connected_ || o.to == first.to))
          break;
        ++n;
      }
    }
    const size_t first_iov = iov.size();
    for (size_t k = 0; k < n; ++k) {
      const Out& o = out_[order[i + k]];
      iov.push_back(iovec{obuf_.data() + o.off, o.len});
      if (o.tail) iov.push_back(iovec{const_cast<uint8_t*>(o.tail), o.tlen});
    }
    mmsghdr m{};
    if (!connected_) {
      m.msg_hdr.msg_name = const_cast<sockaddr_storage*>(&first.to.ss);
      m.msg_hdr.msg_namelen = first.to.len;
    }
    m.msg_hdr.msg_iov = &iov[first_iov];
    m.msg_hdr.msg_iovlen = iov.size() - first_iov;
    if (n > 1) {
      uint8_t* c = ctl.data() + msgs.size() * cspace;
      std::memset(c, 0, cspace);
      m.msg_hdr.msg_control = c;
      m.msg_hdr.msg_controllen = cspace;
      cmsghdr* cm = CMSG_FIRSTHDR(&m.msg_hdr);
      cm->cmsg_level = SOL_UDP;
      cm->cmsg_type = UDP_SEGMENT;
      cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const uint16_t seg = static_cast<uint16_t>(first.size());
      std::memcpy(CMSG_DATA(cm), &seg, sizeof seg);
    }
    msgs.push_back(m);
    meta.push_back(MsgDgrams{n});
    i += n;
    if (msgs.size() == kMaxMsgs) {
      send_messages(msgs, meta, msgs.size());
      msgs.clear();
      meta.clear();
    }
  }
  if (!msgs.empty()) send_messages(msgs, meta, msgs.size());
  out_.clear();
  obuf_.clear();
}

size_t UdpBatch::split_gro(const uint8_t* base, size_t len, int seg, const PeerAddr* from,
                           std::vector<Datagram>* out) {
  if (seg <= 0 || static_cast<size_t>(seg) >= len) {
    out->push_back(Datagram{base, len, from});
    return 1;
  }
  const size_t s = static_cast<size_t>(seg);
  size_t k = 0;
  for (size_t off = 0; off < len; off += s, ++k) out->push_back(Datagram{base + off, std::min(s, len - off), from});
  return k;
}

size_t UdpBatch::recv_batch(std::vector<Datagram>* out, size_t max_datagrams) {
  out->clear();
  const size_t bufsz = gro_ ? kGroBuffer : kPlainBuffer;
  size_t nmsg = std::min(kMaxMsgs, std::max<size_t>(1, max_datagrams));
  if (gro_) nmsg = std::min<size_t>(nmsg, 16);  // 1 MiB of coalesced buffers at most
  if (rbuf_.size() < nmsg * bufsz) rbuf_.resize(nmsg * bufsz);
  raddr_.resize(nmsg);
  rmsg_.resize(nmsg);
  riov_.resize(nmsg);
  const size_t cspace = CMSG_SPACE(sizeof(int));
  rctl_.assign(nmsg * cspace, 0);
  for (size_t i = 0; i < nmsg; ++i) {
    riov_[i] = iovec{rbuf_.data() + i * bufsz, bufsz};
    std::memset(&rmsg_[i], 0, sizeof rmsg_[i]);
    rmsg_[i].msg_hdr.msg_name = &raddr_[i].ss;
    rmsg_[i].msg_hdr.msg_namelen = sizeof raddr_[i].ss;
    rmsg_[i].msg_hdr.msg_iov = &riov_[i];
    rmsg_[i].msg_hdr.msg_iovlen = 1;
    rmsg_[i].msg_hdr.msg_control = rctl_.data() + i * cspace;
    rmsg_[i].msg_hdr.msg_controllen = cspace;
  }
  const sys::SysResult r = THC_SYS(::recvmmsg(fd_, rmsg_.data(), static_cast<unsigned>(nmsg), MSG_DONTWAIT, nullptr));
  st_.recv_calls++;
  if (!r.ok()) {
    if (!r.would_block()) st_.last_errno = r.err;  // e.g. ECONNREFUSED: nobody at the peer's port
    return 0;
  }
  for (size_t i = 0; i < static_cast<size_t>(r.rc); ++i) {
    msghdr& h = rmsg_[i].msg_hdr;
    raddr_[i].len = h.msg_namelen;
    const uint8_t* base = rbuf_.data() + i * bufsz;
    const size_t len = rmsg_[i].msg_len;
    if (h.msg_flags & MSG_TRUNC) {  // larger than any datagram of ours: not ours
      st_.truncated++;
      continue;
    }
    int seg = 0;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm; cm = CMSG_NXTHDR(&h, cm))
      if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) std::memcpy(&seg, CMSG_DATA(cm), sizeof seg);
    const size_t k = split_gro(base, len, seg, &raddr_[i], out);
    if (k > 1) {
      st_.gro_buffers++;
      st_.gro_datagrams += k;
    }
  }
  st_.datagrams_received += out->size();
  return out->size();
}

}  // namespace thc
