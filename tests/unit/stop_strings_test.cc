// server/stop_strings: the KMP scan against the plain definition (earliest occurrence of any
// stop by std::string::find; else the longest suffix of the text that is a proper prefix of a
// stop, by comparing every length) on random texts and stops over small alphabets, where
// overlaps and partial matches are frequent.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/stop_strings.h"

namespace arbor {
namespace {

StopStrings::Scan reference(const std::string& text, const std::vector<std::string>& stops) {
  StopStrings::Scan out;
  for (const std::string& s : stops) out.cut = std::min(out.cut, text.find(s));
  if (out.cut != std::string::npos) return out;
  for (const std::string& s : stops)
    for (size_t len = std::min(s.size() - 1, text.size()); len > out.keep; --len)
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        out.keep = len;
        break;
      }
  return out;
}

std::string random_string(std::mt19937& rng, size_t min_len, size_t max_len, int alphabet) {
  std::uniform_int_distribution<size_t> len(min_len, max_len);
  std::uniform_int_distribution<int> ch(0, alphabet - 1);
  std::string s(len(rng), 'a');
  for (char& c : s) c = static_cast<char>('a' + ch(rng));
  return s;
}

TEST(StopStrings, MatchesTheDefinitionOnRandomInputs) {
  std::mt19937 rng(20261128);
  for (int trial = 0; trial < 20000; ++trial) {
    const int alphabet = 2 + trial % 3;
    std::vector<std::string> stops;
    const int n = 1 + trial % 4;
    for (int k = 0; k < n; ++k) stops.push_back(random_string(rng, 1, 6, alphabet));
    const std::string text = random_string(rng, 0, 24, alphabet);
    const StopStrings matcher(stops);
    const StopStrings::Scan got = matcher.scan(text);
    const StopStrings::Scan want = reference(text, stops);
    ASSERT_EQ(got.cut, want.cut) << "text '" << text << "' stop[0] '" << stops[0] << "'";
    ASSERT_EQ(got.keep, want.keep) << "text '" << text << "' stop[0] '" << stops[0] << "'";
  }
}

TEST(StopStrings, EarliestStartWinsOverEarliestEnd) {
  const StopStrings matcher({"c", "abcd"});
  EXPECT_EQ(matcher.scan("xxabcd").cut, 2u);  // "abcd" starts before "c"
  EXPECT_EQ(matcher.scan("xxabc").cut, 4u);   // only "c" is complete
}

TEST(StopStrings, AdversarialRepetitionsStayLinear) {
  // 16 stops of 255 'a' + 'b' over 511 'a': a quadratic scan does ~16 x 255 x 511 compares.
  std::vector<std::string> stops(16, std::string(255, 'a') + "b");
  const StopStrings matcher(stops);
  const std::string text(511, 'a');
  const StopStrings::Scan s = matcher.scan(text);
  EXPECT_EQ(s.cut, std::string::npos);
  EXPECT_EQ(s.keep, 255u);
  EXPECT_EQ(matcher.scan(text + "b").cut, 256u);
}

}  // namespace
}  // namespace arbor
