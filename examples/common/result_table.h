// A results table, aligned for people (stdout) and as CSV for tools: zero-bench's results and zero-train's reports.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace zero {

struct Column {
  std::string name;  // no spaces or commas: the header of both forms
  int decimals = 0;  // digits after the point for double cells in the text form
};

using Cell = std::variant<std::string, int64_t, double>;

class ResultTable {
 public:
  explicit ResultTable(std::vector<Column> columns);

  // One cell per column.
  void add_row(std::vector<Cell> cells);

  const std::vector<Column>& columns() const { return columns_; }
  size_t num_rows() const { return rows_.size(); }

  // A header line, then one line per row; columns right-aligned, separated by at least two spaces.
  std::string to_text() const;
  // A header line, then one line per row; doubles with 9 significant digits so ratios survive the trip.
  std::string to_csv() const;

 private:
  std::string text_cell(size_t column, const Cell& cell) const;

  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
};

}  // namespace zero
