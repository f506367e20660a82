/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz corpus replay as Check tests (fuzz_replay.h). */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz_replay.h"
#include "tests/support/suite.h"
#include "tests/unit.h"

#define MAX_CORPORA 4
#define MAX_FILES   4096

struct files {
	const struct fr_corpus *c;
	char *path[MAX_FILES];
	int n;
};

static struct files sets[MAX_CORPORA];
static int nsets, from_corpus;

static void add_file(struct files *f, const char *path)
{
	if (f->n < MAX_FILES)
		f->path[f->n++] = strdup(path);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of dir, sorted. */
static void add_dir(struct files *f, const char *dir)
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
			add_file(f, path);
	}
	closedir(d);
	qsort(f->path, (size_t)f->n, sizeof(f->path[0]), by_name);
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

START_TEST(corpora_present)
{
	for (int k = 0; k < nsets; k++)
		ck_assert_msg(!from_corpus || sets[k].n >= 10,
			      "found %d %s corpus files; is TW_TOP_SRCDIR set to the source tree?",
			      sets[k].n, sets[k].c->name);
}
END_TEST

/* Loop index _i runs over the files of all sets in turn. */
START_TEST(replay)
{
	int k = 0, i = _i;
	size_t len = 0;
	uint8_t *data;
	while (i >= sets[k].n)
		i -= sets[k++].n;
	data = read_all(sets[k].path[i], &len);
	ck_assert_msg(data != NULL, "cannot read %s", sets[k].path[i]);
	fprintf(stderr, "replay %s %s (%zu bytes)\n", sets[k].c->name, sets[k].path[i], len);
	ck_assert_int_eq(sets[k].c->entry(data, len), 0);
	free(data);
}
END_TEST

/* Files named on the command line; 0, or -1 on a usage error. */
static int from_args(int argc, char **argv, int n)
{
	int first = 1;
	struct files *f = &sets[0];
	if (n > 1) {
		f = NULL;
		for (int k = 0; argc > 2 && k < n; k++)
			if (strcmp(argv[1], sets[k].c->name) == 0)
				f = &sets[k];
		first = 2;
	}
	if (f == NULL)
		return -1;
	for (int i = first; i < argc; i++)
		add_file(f, argv[i]);
	return 0;
}

int fr_main(int argc, char **argv, const char *suite, const struct fr_corpus *corpora, int n)
{
	Suite *s = suite_create(suite);
	TCase *tc = tcase_create("replay");
	int total = 0, rv;
	nsets = n < MAX_CORPORA ? n : MAX_CORPORA;
	for (int k = 0; k < nsets; k++)
		sets[k].c = &corpora[k];
	if (argc > 1 && from_args(argc, argv, nsets) != 0) {
		fprintf(stderr, "usage: %s [%sFILE...]\n", argv[0], nsets > 1 ? "NAME " : "");
		return EXIT_FAILURE;
	}
	if (argc <= 1) {
		const char *top = getenv("TW_TOP_SRCDIR");
		for (int k = 0; k < nsets; k++) {
			char dir[4096];
			snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s",
				 top != NULL ? top : ".", corpora[k].dir);
			add_dir(&sets[k], dir);
		}
		from_corpus = 1;
	}
	for (int k = 0; k < nsets; k++)
		total += sets[k].n;
	tcase_add_test(tc, corpora_present);
	tcase_add_loop_test(tc, replay, 0, total);
	suite_add_tcase(s, tc);
	rv = ts_run(s, 0);
	for (int k = 0; k < nsets; k++)
		for (int i = 0; i < sets[k].n; i++)
			free(sets[k].path[i]);
	return rv;
}
