#include "switch_offload/switchd/dataplane.h"

#include <arpa/inet.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace thc::switch_offload::switchd {

std::string ip_str(uint32_t ip) {
  char b[INET_ADDRSTRLEN];
  const uint32_t be = htonl(ip);
  return inet_ntop(AF_INET, &be, b, sizeof b) ? b : "?";
}

std::string mac_str(const Mac& m) {
  char b[18];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

bool parse_ip(const std::string& s, uint32_t* ip) {
  in_addr a{};
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) return false;
  *ip = ntohl(a.s_addr);
  return true;
}

bool parse_mac(const std::string& s, Mac* m) {
  unsigned v[6];
  char tail;
  if (s.size() != 17 || std::sscanf(s.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                                    &tail) != 6)
    return false;
  for (int i = 0; i < 6; ++i) (*m)[i] = static_cast<uint8_t>(v[i]);
  return true;
}

bool parse_route(const std::string& spec, Route* r, std::string* err) {
  std::string s = spec;
  for (char& c : s)
    if (c == ',' || c == '\t') c = ' ';
  std::istringstream in(s);
  std::string ip, port, mac, extra;
  if (!(in >> ip >> port >> mac) || (in >> extra)) {
    *err = "route '" + spec + "': expected IP,PORT,MAC";
    return false;
  }
  Route x;
  if (!parse_ip(ip, &x.ip)) {
    *err = "route '" + spec + "': '" + ip + "' is not an IPv4 address";
    return false;
  }
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end || p > 510) {
    *err = "route '" + spec + "': port '" + port + "' is not a switch port (0..510)";
    return false;
  }
  x.port = static_cast<uint16_t>(p);
  if (!parse_mac(mac, &x.mac)) {
    *err = "route '" + spec + "': '" + mac + "' is not a MAC address (aa:bb:cc:dd:ee:ff)";
    return false;
  }
  *r = x;
  return true;
}

bool load_routes(const std::string& path, std::vector<Route>* out, std::string* err) {
  std::ifstream f(path);
  if (!f) {
    *err = "cannot read routes file " + path;
    return false;
  }
  std::string line;
  int no = 0;
  while (std::getline(f, line)) {
    ++no;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Route r;
    if (!parse_route(line, &r, err)) {
      *err = path + ":" + std::to_string(no) + ": " + *err;
      return false;
    }
    out->push_back(r);
  }
  return true;
}

}  // namespace thc::switch_offload::switchd
