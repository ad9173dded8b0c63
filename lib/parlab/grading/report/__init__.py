"""parlab.grading.report: the instructor's steps 4 and 6, grades and the class's picture.

- `export`: grades.csv, one row per student and released module (`make export`);
- `html`: report.html, what the class got right and wrong, per module (`make report`);
- `platform`, `canvas`, `moodle`: the grades in a learning platform's own import format
  (`make export FORMAT=canvas|moodle`), as nbgrader export plugins;
- `status`, `status_page`: who has fetched, submitted (how late), been graded and had feedback
  returned, per student of the roster (`make status`; the instructor's hub server's page).

May import: parlab.grading.base, parlab.grading.engines (the grading record and results);
and parlab.hub.roster (the class list, for who is retired), parlab.hub.records (the exchange's
records of fetches, hand-ins and returned feedback, for `make status`).
"""
