#include "perf/nmse/plot.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace thc::perf {
namespace {

bool have(const char* check_cmd) { return std::system(check_cmd) == 0; }

// Single-quoted for gnuplot ('' inside is a literal quote).
std::string gq(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o + "'";
}
// Python string literal.
std::string pq(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    if (c == '\\' || c == '\'') o += '\\';
    o += c;
  }
  return o + "'";
}
// Single-quoted for sh.
std::string sq(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

struct TmpDir {
  std::string path;
  TmpDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/thc_plot.XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("--plot: cannot create a temporary directory");
    path = tmpl;
  }
  ~TmpDir() { std::system(("rm -rf " + sq(path)).c_str()); }
};

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

}  // namespace

std::string plot_png(const PlotSpec& spec, const std::vector<Series>& series) {
  const char* force = std::getenv("THC_PLOT");
  const std::string want = force ? force : "";
  const bool gp = (want.empty() || want == "gnuplot") && have("command -v gnuplot >/dev/null 2>&1");
  const bool mpl = !gp && (want.empty() || want == "matplotlib") &&
                   have("python3 -c 'import matplotlib' >/dev/null 2>&1");
  if (!gp && !mpl)
    throw std::runtime_error(
        "--plot needs gnuplot (Debian: apt-get install gnuplot-nox) or python3 with matplotlib "
        "(apt-get install python3-matplotlib); neither was found" +
        (want.empty() ? std::string() : " (THC_PLOT=" + want + ")"));

  TmpDir tmp;
  const std::string data = tmp.path + "/data.txt";
  {
    std::ofstream f(data);
    for (size_t s = 0; s < series.size(); ++s) {
      f << "# " << series[s].title << "\n";
      bool any = false;
      for (const auto& p : series[s].points)
        if (usable(p.first, spec.logx) && usable(p.second, spec.logy)) {
          f << p.first << " " << p.second << "\n";
          any = true;
        }
      if (!any) f << "nan nan\n";  // keep the index numbering of gnuplot's `index`
      f << "\n\n";
    }
  }
  std::string cmd;
  if (gp) {
    const std::string script = tmp.path + "/plot.gp";
    std::ofstream f(script);
    f << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,650 noenhanced } "
         "else { set terminal png size 1000,650 noenhanced }\n";
    f << "set output " << gq(spec.file) << "\n";
    f << "set title " << gq(spec.title) << "\n";
    f << "set xlabel " << gq(spec.xlabel) << "\nset ylabel " << gq(spec.ylabel) << "\n";
    if (spec.logx) f << "set logscale x 2\n";
    if (spec.logy) f << "set logscale y\nset format y '%.0e'\n";
    f << "set grid\nset key outside right\nset datafile missing 'nan'\n";
    f << "plot ";
    for (size_t s = 0; s < series.size(); ++s)
      f << (s ? ", \\\n     " : "") << gq(data) << " index " << s << " using 1:2 with linespoints title "
        << gq(series[s].title);
    f << "\n";
    f.close();
    cmd = "gnuplot " + sq(script) + " 2>&1";
  } else {
    const std::string script = tmp.path + "/plot.py";
    std::ofstream f(script);
    f << "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n";
    f << "blocks = open(" << pq(data) << ").read().split('\\n\\n\\n')\n";
    f << "titles = [";
    for (size_t s = 0; s < series.size(); ++s) f << (s ? ", " : "") << pq(series[s].title);
    f << "]\nfig, ax = plt.subplots(figsize=(10, 6.5))\n";
    f << "for t, b in zip(titles, blocks):\n"
         "    pts = [tuple(map(float, l.split())) for l in b.splitlines() if l and not l.startswith('#')]\n"
         "    pts = [p for p in pts if p[0] == p[0]]\n"
         "    if pts: ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', label=t)\n";
    if (spec.logx) f << "ax.set_xscale('log', base=2)\n";
    if (spec.logy) f << "ax.set_yscale('log')\n";
    f << "ax.set_title(" << pq(spec.title) << ")\nax.set_xlabel(" << pq(spec.xlabel) << ")\nax.set_ylabel("
      << pq(spec.ylabel) << ")\n";
    f << "ax.grid(True)\nax.legend(loc='center left', bbox_to_anchor=(1, 0.5))\nfig.tight_layout()\n";
    f << "fig.savefig(" << pq(spec.file) << ", dpi=100)\n";
    f.close();
    cmd = "python3 " + sq(script) + " 2>&1";
  }
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int rc = ::pclose(p);
    struct stat st;
    if (rc != 0 || ::stat(spec.file.c_str(), &st) != 0 || st.st_size == 0)
      throw std::runtime_error(std::string("--plot: ") + (gp ? "gnuplot" : "matplotlib") + " failed to write '" +
                               spec.file + "'" + (out.empty() ? "" : ":\n" + out));
  } else {
    throw std::runtime_error("--plot: cannot run " + cmd);
  }
  return gp ? "gnuplot" : "matplotlib";
}

}  // namespace thc::perf
