#include "cc/lib/rounding_table_ids.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

TEST(RoundingTableIds, NoneGivenIsEachTablesPosition) {
  std::vector<int64_t> ids = {9};
  ASSERT_TRUE(ResolveRoundingTableIds({}, 3, "rounding_table_ids", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2}));
}

TEST(RoundingTableIds, GivenIdsAreKept) {
  std::vector<int64_t> ids;
  ASSERT_TRUE(ResolveRoundingTableIds({4, 0, 7}, 3, "rounding_table_ids", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int64_t>{4, 0, 7}));
}

TEST(RoundingTableIds, BadIdsAreRejectedNamingTheAttrAndWriteNothing) {
  const std::vector<int64_t> untouched = {5};
  struct Case {
    std::vector<int64_t> given;
    const char* message;
  };
  const Case cases[] = {
      {{0}, "ids has 1 entries; give none (each table's position in the config) or one per table (2)"},
      {{0, 1, 2}, "ids has 3 entries"},
      {{0, -1}, "ids[1] is -1; must be >= 0"},
      {{3, 3}, "ids[1] is 3, as ids[0]: each table needs its own id"},
  };
  for (const Case& c : cases) {
    std::vector<int64_t> ids = untouched;
    const absl::Status status = ResolveRoundingTableIds(c.given, 2, "ids", &ids);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status.message();
    EXPECT_EQ(ids, untouched);
  }
}

}  // namespace
}  // namespace tf_embed_ops
