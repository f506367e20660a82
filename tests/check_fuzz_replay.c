/* Replays fuzz corpora through the fuzz targets' entry point, so `make
 * check` runs every seed and every saved crash as a test. With no
 * arguments it replays $TW_TOP_SRCDIR/tests/fuzz/corpus/stream (set by
 * TESTS_ENVIRONMENT); with arguments, those files instead (a crash file
 * from libFuzzer, without building the fuzzer). A target that finds a
 * broken invariant aborts, which fails the test of that file. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"
#include "tests/unit.h"

#define MAX_FILES 4096

static char *files[MAX_FILES];
static int nfiles;
static int from_corpus;

static void add_file(const char *path)
{
	if (nfiles < MAX_FILES)
		files[nfiles++] = strdup(path);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of dir, sorted. */
static void add_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int first = nfiles;
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
	qsort(files + first, (size_t)(nfiles - first), sizeof(files[0]), by_name);
}

static uint8_t *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;
	if (f == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) != NULL) {
		*len = fread(buf, 1, (size_t)n, f);
		if (*len != (size_t)n) {
			free(buf);
			buf = NULL;
		}
	}
	fclose(f);
	return buf;
}

/* The seed corpus is there (a missing directory must not pass as an empty
 * replay). */
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
	fprintf(stderr, "replay %s (%zu bytes)\n", files[_i], len);
	ck_assert_int_eq(LLVMFuzzerTestOneInput(data, len), 0);
	free(data);
}
END_TEST

static Suite *replay_suite(void)
{
	Suite *s = suite_create("fuzz_replay");
	TCase *tc = tcase_create("stream");
	tcase_add_test(tc, corpus_present);
	tcase_add_loop_test(tc, replay, 0, nfiles);
	suite_add_tcase(s, tc);
	return s;
}

int main(int argc, char **argv)
{
	int rv;
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			add_file(argv[i]);
	} else {
		const char *top = getenv("TW_TOP_SRCDIR");
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/stream", top != NULL ? top : ".");
		add_dir(dir);
		from_corpus = 1;
	}
	rv = run_suite(replay_suite());
	for (int i = 0; i < nfiles; i++)
		free(files[i]);
	return rv;
}
