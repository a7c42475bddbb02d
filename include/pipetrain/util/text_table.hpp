// Rows of text laid out in columns, each as wide as its widest cell, so a table printed for a
// person stays aligned whatever the names and values hold (long tensor names, node lists).
#pragma once
#include <string>
#include <vector>

namespace pipetrain {

// Each row's cells padded to their column's width (in characters: UTF-8 counted by code point)
// and joined by two spaces; every line starts with `indent` and ends with "\n". Columns listed in
// `right_aligned` (0-based) are padded on the left (numbers); the last column is never padded on
// the right. Rows may have fewer cells than others.
std::string text_table(const std::vector<std::vector<std::string>>& rows, const std::string& indent = "",
                       const std::vector<size_t>& right_aligned = {});

}  // namespace pipetrain
