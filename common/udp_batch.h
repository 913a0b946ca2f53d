// Batched UDP I/O for the aggregator and its clients: few system calls per many datagrams.
//
// Sending: datagrams are queued (copied), then flush() sends them grouped by destination; a run
// of equal-size datagrams to one destination goes out as one UDP GSO buffer (UDP_SEGMENT, Linux
// 4.18+): the kernel carries it as one packet through the stack (veth, bridge, tbf) and a GRO
// socket at the other end receives it whole. Several such buffers go in one sendmmsg. Without
// GSO support (or when a GSO send is refused) it falls back to one datagram per message.
//
// Receiving: with UDP_GRO (Linux 5.0+) the kernel hands over coalesced runs of datagrams from
// one source in one buffer, with the segment size in a control message; recv_batch() splits them
// again. The caller sees datagrams exactly as sent either way.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/net.h"

namespace thc {

struct UdpBatchStats {
  uint64_t datagrams_sent = 0;
  uint64_t send_calls = 0;      // sendmmsg/sendmsg calls
  uint64_t gso_buffers = 0;     // multi-datagram GSO buffers sent
  uint64_t send_errors = 0;     // datagrams lost to a full buffer or an error (UDP semantics)
  uint64_t datagrams_received = 0;
  uint64_t recv_calls = 0;
  uint64_t gro_buffers = 0;     // received buffers holding more than one datagram
  uint64_t gro_datagrams = 0;   // datagrams that came in such buffers
  uint64_t gso_datagrams = 0;   // datagrams sent in multi-datagram GSO buffers
  uint64_t truncated = 0;       // received messages larger than the buffer: dropped (not ours)
  int last_errno = 0;
};

class UdpBatch {
 public:
  // fd: a nonblocking UDP socket. connected: the socket is connect()ed (no destination address
  // per message). Enables UDP_GRO on the socket where the kernel has it.
  explicit UdpBatch(int fd, bool connected, bool gso = true, bool gro = true);

  // Queue one datagram (to is ignored on a connected socket).
  void queue(const PeerAddr& to, const uint8_t* data, size_t len);
  // Queue one datagram of two parts: head is copied, tail is sent from where it is and must stay
  // valid and unchanged until flush() (the engine's results: one payload for every recipient).
  void queue_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen);
  size_t queued() const { return out_.size(); }
  // Send everything queued. Errors (EAGAIN, ECONNREFUSED, ...) lose datagrams, as UDP does.
  void flush();

  // Receive what is there without blocking, up to max_datagrams. Datagrams are valid until the
  // next call. Returns the number received.
  struct Datagram {
    const uint8_t* data;
    size_t len;
    const PeerAddr* from;
  };
  size_t recv_batch(std::vector<Datagram>* out, size_t max_datagrams);

  // One received buffer as the datagrams in it: segments of seg bytes (the UDP_GRO control
  // message's value), the last one possibly shorter; seg <= 0 or >= len: one datagram (no
  // coalescing). Appends to out; returns how many.
  static size_t split_gro(const uint8_t* base, size_t len, int seg, const PeerAddr* from,
                          std::vector<Datagram>* out);

  bool gso() const { return gso_; }
  bool gro() const { return gro_; }
  const UdpBatchStats& stats() const { return st_; }

 private:
  struct Out {
    PeerAddr to;
    size_t off, len;                // the copied part in obuf_
    const uint8_t* tail = nullptr;  // queue_parts: the part sent in place
    size_t tlen = 0;
    size_t size() const { return len + tlen; }
  };
  // Per message: how many datagrams it carries (one, or a GSO run).
  struct MsgDgrams {
    size_t datagrams;
  };
  void send_messages(std::vector<mmsghdr>& msgs, const std::vector<MsgDgrams>& meta, size_t count);

  int fd_;
  bool connected_;
  bool gso_ = false;
  bool gro_ = false;
  std::vector<uint8_t> obuf_;  // queued bytes, grouped per destination at flush
  std::vector<Out> out_;
  std::vector<uint8_t> gbuf_;  // GSO staging
  std::vector<size_t> order_;  // flush() scratch
  std::vector<char> taken_;
  std::vector<iovec> iov_;
  std::vector<uint8_t> rbuf_;  // receive buffers
  std::vector<PeerAddr> raddr_;
  std::vector<mmsghdr> rmsg_;
  std::vector<iovec> riov_;
  std::vector<uint8_t> rctl_;
  UdpBatchStats st_;
};

}  // namespace thc
