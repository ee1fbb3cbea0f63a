// The analyst dashboard's figures and filters, kept out of the page so the portal's
// Content-Security-Policy can forbid inline script.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("script.figure-data").forEach(function (block) {
    var figure = JSON.parse(block.textContent);
    Plotly.newPlot(block.dataset.target, figure.data, figure.layout,
      {responsive: true, displaylogo: false});
  });
  var study = document.getElementById("f-study");
  if (study) {
    study.addEventListener("change", function () { study.form.submit(); });
  }
});
