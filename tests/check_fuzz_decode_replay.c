/* Replays the tw_decode fuzz corpus through the fuzz target's entry point
 * (tests/fuzz/fuzz_decode.c), so `make check` runs every seed and every
 * saved crash. With no arguments it replays
 * $TW_TOP_SRCDIR/tests/fuzz/corpus/decode (set by TESTS_ENVIRONMENT); with
 * arguments, those files (a libFuzzer crash file, without building the
 * fuzzer). A broken invariant aborts, which fails the test of that file. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

#define MAX_FILES 4096

static char *files[MAX_FILES];
static int nfiles;
static int from_corpus;

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_file(const char *path)
{
	if (nfiles < MAX_FILES)
		files[nfiles++] = strdup(path);
}

static void add_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		char path[4096];
		struct stat st;
		int n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (n > 0 && (size_t)n < sizeof(path) && e->d_name[0] != '.' &&
		    stat(path, &st) == 0 && S_ISREG(st.st_mode))
			add_file(path);
	}
	closedir(d);
	qsort(files, (size_t)nfiles, sizeof(files[0]), by_name);
}

static uint8_t *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;
	if (f == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	*len = buf != NULL ? (size_t)n : 0;
	fclose(f);
	return buf;
}

/* A missing corpus must not pass as an empty replay. */
START_TEST(corpus_present)
{
	ck_assert_msg(!from_corpus || nfiles >= 10,
		      "found %d corpus files; is TW_TOP_SRCDIR set to the source tree?", nfiles);
}
END_TEST

START_TEST(replay)
{
	size_t len = 0;
	uint8_t *data = read_all(files[_i], &len);
	ck_assert_msg(data != NULL, "cannot read %s", files[_i]);
	ck_assert_int_eq(LLVMFuzzerTestOneInput(data, len), 0);
	free(data);
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("fuzz_decode_replay");
	TCase *tc = tcase_create("decode");
	SRunner *sr;
	int failed;
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			add_file(argv[i]);
	} else {
		const char *top = getenv("TW_TOP_SRCDIR");
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/decode", top != NULL ? top : ".");
		add_dir(dir);
		from_corpus = 1;
	}
	tcase_add_test(tc, corpus_present);
	tcase_add_loop_test(tc, replay, 0, nfiles);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	for (int i = 0; i < nfiles; i++)
		free(files[i]);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
