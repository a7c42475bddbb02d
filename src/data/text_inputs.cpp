#include "pipetrain/data/text_inputs.hpp"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "pipetrain/data/tokenizer.hpp"
#include "pipetrain/util/errors.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

bool is_jsonl(const std::string& path) {
  auto ends = [&](const std::string& tail) {
    return path.size() >= tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".jsonl") || ends(".jsonl.gz");
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given) {
    std::error_code ec;
    std::vector<std::string> found;
    if (fs::is_directory(g, ec)) {
      for (const auto& e : fs::directory_iterator(g, ec))
        if (e.is_regular_file(ec)) found.push_back(e.path().string());
    } else if (g.find_first_of("*?[") != std::string::npos && !fs::exists(g, ec)) {
      glob_t matches{};
      if (::glob(g.c_str(), 0, nullptr, &matches) == 0)
        for (size_t i = 0; i < matches.gl_pathc; ++i) found.push_back(matches.gl_pathv[i]);
      globfree(&matches);
    } else {
      found.push_back(g);  // a file (checked when read)
    }
    if (found.empty()) throw SpecError("data prepare: --input " + g + ": names no file (an empty folder or glob)");
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

TextInput::TextInput(const std::string& path, DocumentSplit split)
    : path_(path), split_(split), jsonl_(is_jsonl(path)) {
  gz_ = gzopen(path.c_str(), "rb");
  if (!gz_) throw SpecError("data prepare: --input " + path + ": " + std::strerror(errno ? errno : ENOMEM));
  gzbuffer(static_cast<gzFile>(gz_), 1 << 20);
}

TextInput::~TextInput() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

uint64_t TextInput::bytes_read() const { return static_cast<uint64_t>(gzoffset(static_cast<gzFile>(gz_))); }

bool TextInput::read_more(size_t bytes) {
  if (eof_) return false;
  const size_t had = pending_.size();
  pending_.resize(had + bytes);
  const int got = gzread(static_cast<gzFile>(gz_), pending_.data() + had, static_cast<unsigned>(bytes));
  if (got < 0) {
    int code = 0;
    const char* why = gzerror(static_cast<gzFile>(gz_), &code);
    throw SpecError("data prepare: --input " + path_ + ": " + (code == Z_ERRNO ? std::strerror(errno) : why) +
                    " (a damaged or truncated .gz?)");
  }
  pending_.resize(had + static_cast<size_t>(got));
  if (static_cast<size_t>(got) < bytes) eof_ = true;
  return got > 0;
}

bool TextInput::next(TextBlock& block, size_t bytes) {
  block.text.clear();
  block.ends.clear();
  if (ended_) return false;
  if (jsonl_) next_records(block, bytes);
  else next_text(block, bytes);
  return !block.text.empty() || !block.ends.empty();
}

// About `bytes` of text ending at a line end (a line longer than 4 blocks is cut), with a document
// ending after each blank line (paragraph) and at the file's end (file, paragraph).
void TextInput::next_text(TextBlock& block, size_t bytes) {
  while (pending_.size() < bytes && read_more(bytes - pending_.size())) {
  }
  size_t cut = pending_.size();
  if (!eof_ || pending_.size() > bytes) {
    const size_t line_end = pending_.rfind('\n', std::min(pending_.size(), bytes) - 1);
    if (line_end != std::string::npos) {
      cut = line_end + 1;
    } else {  // no line end within the block: read on to one, up to 4 blocks
      while (pending_.find('\n') == std::string::npos && pending_.size() < 4 * bytes && read_more(bytes)) {
      }
      const size_t end = pending_.find('\n');
      // A line over 4 blocks is cut after a space, or else never inside a UTF-8 character.
      cut = end != std::string::npos               ? end + 1
            : eof_ && pending_.size() <= 4 * bytes ? pending_.size()  // the file's last line
                                                   : text_cut(pending_, 0, 4 * bytes - 1);
    }
  }
  block.text.assign(pending_, 0, cut);
  pending_.erase(0, cut);
  // A paragraph is text and the blank lines (\r aside) after it: it ends where the next text's line
  // begins (within this block: blocks end at line ends).
  size_t line_start = 0;
  for (size_t i = 0; i < block.text.size(); ++i) {
    const char c = block.text[i];
    if (c == '\r') continue;
    if (c != '\n') {
      if (blank_after_text_ && split_ == DocumentSplit::paragraph) block.ends.push_back(line_start);
      blank_after_text_ = false;
      content_ = true;
    } else {
      if (after_newline_ && content_) blank_after_text_ = true;
      line_start = i + 1;
    }
    after_newline_ = c == '\n';
  }
  ended_ = eof_ && pending_.empty();
  if (ended_ && split_ != DocumentSplit::none && content_) block.ends.push_back(block.text.size());
}

// Whole records up to about `bytes` of their text, each one document.
void TextInput::next_records(TextBlock& block, size_t bytes) {
  while (block.text.size() < bytes) {
    size_t end = pending_.find('\n');
    while (end == std::string::npos && read_more(1 << 20)) end = pending_.find('\n');
    if (end == std::string::npos) end = pending_.size();  // the last line, without a newline
    if (end == 0 && pending_.empty()) {
      ended_ = true;
      return;
    }
    const std::string line = pending_.substr(0, end);
    pending_.erase(0, std::min(pending_.size(), end + 1));
    ++line_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines hold no record
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    const auto text = record.is_object() ? record.find("text") : record.end();
    if (!record.is_object() || text == record.end() || !text->is_string())
      throw SpecError("data prepare: " + path_ + ":" + std::to_string(line_) +
                      ": not a JSON object with a string \"text\" (each line of a .jsonl file is one record)");
    block.text += text->get_ref<const std::string&>();
    block.ends.push_back(block.text.size());
  }
}

}  // namespace pipetrain
