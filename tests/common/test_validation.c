#include "sa_test.h"
START_TEST(test_placeholder) { ck_assert_int_eq(sa_shape_check(NULL), SA_ERR_NULL); }
END_TEST
int main(void)
{
    Suite *s = suite_create("validation");
    TCase *tc = tcase_create("shape");
    tcase_add_test(tc, test_placeholder);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
