/* Replays the WebSocket fuzz corpora through the fuzz targets' entry
 * points (tests/fuzz/fuzz_ws_codec.c and fuzz_ws_upgrade.c, built into this
 * program with -DTW_FUZZ_REPLAY), so `make check` runs every seed and every
 * saved crash as a test. With no arguments it replays
 * $TW_TOP_SRCDIR/tests/fuzz/corpus/ws_codec and .../ws_upgrade (set by
 * TESTS_ENVIRONMENT); with arguments `codec FILE...` or `upgrade FILE...`,
 * those files instead (a crash file from libFuzzer, without building the
 * fuzzer). A target that finds a broken invariant aborts, which fails the
 * test of that file. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_ws.h"
#include "tests/unit.h"

#define MAX_FILES 4096

struct corpus {
	const char *name;
	int (*entry)(const uint8_t *data, size_t size);
	char *files[MAX_FILES];
	int n;
};

static struct corpus corpora[2] = {{"codec", ws_fuzz_codec, {NULL}, 0},
				   {"upgrade", ws_fuzz_upgrade, {NULL}, 0}};
static int from_corpus;

static void add_file(struct corpus *c, const char *path)
{
	if (c->n < MAX_FILES)
		c->files[c->n++] = strdup(path);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of dir, sorted. */
static void add_dir(struct corpus *c, const char *dir)
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
			add_file(c, path);
	}
	closedir(d);
	qsort(c->files, (size_t)c->n, sizeof(c->files[0]), by_name);
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

static void replay(struct corpus *c, int i)
{
	size_t len = 0;
	uint8_t *data = read_all(c->files[i], &len);
	ck_assert_msg(data != NULL, "cannot read %s", c->files[i]);
	fprintf(stderr, "replay %s %s (%zu bytes)\n", c->name, c->files[i], len);
	ck_assert_int_eq(c->entry(data, len), 0);
	free(data);
}

/* The seed corpora are there (a missing directory must not pass as an
 * empty replay). */
START_TEST(corpora_present)
{
	for (int k = 0; k < 2; k++)
		ck_assert_msg(!from_corpus || corpora[k].n >= 10,
			      "found %d %s corpus files; is TW_TOP_SRCDIR set to the source tree?",
			      corpora[k].n, corpora[k].name);
}
END_TEST

START_TEST(replay_codec)
{
	replay(&corpora[0], _i);
}
END_TEST

START_TEST(replay_upgrade)
{
	replay(&corpora[1], _i);
}
END_TEST

static Suite *replay_suite(void)
{
	Suite *s = suite_create("ws_fuzz_replay");
	TCase *tc = tcase_create("ws");
	tcase_add_test(tc, corpora_present);
	tcase_add_loop_test(tc, replay_codec, 0, corpora[0].n);
	tcase_add_loop_test(tc, replay_upgrade, 0, corpora[1].n);
	suite_add_tcase(s, tc);
	return s;
}

int main(int argc, char **argv)
{
	int rv;
	if (argc > 1) {
		struct corpus *c = NULL;
		for (int k = 0; k < 2; k++)
			if (strcmp(argv[1], corpora[k].name) == 0)
				c = &corpora[k];
		if (c == NULL || argc < 3) {
			fprintf(stderr, "usage: %s [codec|upgrade FILE...]\n", argv[0]);
			return EXIT_FAILURE;
		}
		for (int i = 2; i < argc; i++)
			add_file(c, argv[i]);
	} else {
		const char *top = getenv("TW_TOP_SRCDIR");
		char dir[4096];
		for (int k = 0; k < 2; k++) {
			snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/ws_%s",
				 top != NULL ? top : ".", corpora[k].name);
			add_dir(&corpora[k], dir);
		}
		from_corpus = 1;
	}
	rv = run_suite(replay_suite());
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < corpora[k].n; i++)
			free(corpora[k].files[i]);
	return rv;
}
