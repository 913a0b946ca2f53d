// PNG line plots for thc_nmse: gnuplot if present, else python3 with matplotlib.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace thc::perf {

struct Series {
  std::string title;
  std::vector<std::pair<double, double>> points;  // drawn in this order
};

struct PlotSpec {
  std::string file;  // output .png
  std::string title, xlabel, ylabel;
  bool logx = false, logy = true;
};

// Draws the series into spec.file. The backend is gnuplot, else python3 + matplotlib;
// THC_PLOT=gnuplot|matplotlib forces one. Throws std::runtime_error with a clear message if no
// backend is available or plotting fails. Returns the backend used.
std::string plot_png(const PlotSpec& spec, const std::vector<Series>& series);

}  // namespace thc::perf
