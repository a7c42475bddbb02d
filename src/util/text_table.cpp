#include "pipetrain/util/text_table.hpp"

#include <algorithm>

namespace pipetrain {
namespace {

size_t display_width(const std::string& s) {  // code points: every byte that does not continue one
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

}  // namespace

std::string text_table(const std::vector<std::vector<std::string>>& rows, const std::string& indent,
                       const std::vector<size_t>& right_aligned) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], display_width(row[c]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - display_width(row[c]), ' ');
      const bool right = std::find(right_aligned.begin(), right_aligned.end(), c) != right_aligned.end();
      const bool last = c + 1 == row.size();
      line += (c ? "  " : "") + (right ? pad + row[c] : last ? row[c] : row[c] + pad);
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace pipetrain
