"use strict";
// Every table of the page sorts by a click on its header (tablesort, vendored beside this file).
document.querySelectorAll("table.sortable").forEach((table) => new Tablesort(table));
