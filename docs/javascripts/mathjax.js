// MathJax configuration for pymdownx.arithmatex (generic mode): \( \) inline, \[ \] display;
// and for the notebooks' Markdown cells, where mkdocs-jupyter keeps Jupyter's $ $ and $$ $$.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// MathJax reads only what arithmatex marks: mark the notebook paragraphs that hold math too.
function markNotebookMath() {
  const blocks = document.querySelectorAll(".jp-MarkdownCell .jp-RenderedMarkdown :is(p, li)");
  for (const block of blocks) {
    if (block.textContent.includes("$")) block.classList.add("arithmatex");
  }
}
markNotebookMath();

document$.subscribe(() => {
  markNotebookMath();
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
