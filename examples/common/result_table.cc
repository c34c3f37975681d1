#include "examples/common/result_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace zero {
namespace {

std::string csv_cell(const Cell& cell) {
  if (const auto* i = std::get_if<int64_t>(&cell)) return absl::StrCat(*i);
  if (const auto* d = std::get_if<double>(&cell)) return absl::StrFormat("%.9g", *d);
  const std::string& s = std::get<std::string>(cell);
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string quoted = "\"";
  for (char c : s) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

ResultTable::ResultTable(std::vector<Column> columns) : columns_(std::move(columns)) {}

void ResultTable::add_row(std::vector<Cell> cells) {
  ZERO_CHECK(cells.size() == columns_.size(), "a row has ", cells.size(), " cells for ", columns_.size(), " columns");
  rows_.push_back(std::move(cells));
}

std::string ResultTable::text_cell(size_t column, const Cell& cell) const {
  if (const auto* d = std::get_if<double>(&cell)) return absl::StrFormat("%.*f", columns_[column].decimals, *d);
  return csv_cell(cell);
}

std::string ResultTable::to_text() const {
  std::vector<std::vector<std::string>> lines(rows_.size() + 1);
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    lines[0].push_back(columns_[c].name);
    for (size_t r = 0; r < rows_.size(); ++r) lines[r + 1].push_back(text_cell(c, rows_[r][c]));
    for (const auto& line : lines) width[c] = std::max(width[c], line[c].size());
  }
  std::string out;
  for (const auto& line : lines) {
    for (size_t c = 0; c < line.size(); ++c) {
      absl::StrAppend(&out, std::string(width[c] + 2 - line[c].size(), ' '), line[c]);
    }
    out += '\n';
  }
  return out;
}

std::string ResultTable::to_csv() const {
  std::vector<std::string> names;
  for (const Column& c : columns_) names.push_back(c.name);
  std::string out = absl::StrCat(absl::StrJoin(names, ","), "\n");
  for (const auto& row : rows_) {
    absl::StrAppend(&out, absl::StrJoin(row, ",", [](std::string* o, const Cell& c) { o->append(csv_cell(c)); }), "\n");
  }
  return out;
}

}  // namespace zero
