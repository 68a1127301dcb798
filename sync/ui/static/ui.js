// The live parts of a page are replaced by their reload every few seconds. A button pressed
// before a reload and released after it would be two copies of the button, and no click: while
// a button of the part is held down, the reload is not applied (the next one is).
document.addEventListener("htmx:beforeSwap", function (event) {
  var target = event.detail.target;
  if (target && target.querySelector("button:active")) {
    event.detail.shouldSwap = false;
  }
});
