// What a reader of the page at this window width cannot read: run in the page by tests/chromium.py.
// Returns {problems: [{kind, what, detail}], checked: {...}}; every problem is a thing a person would see:
// - "past the right edge": an element that reaches beyond the window (the page scrolls sideways);
// - "cut": an element that hides part of its content (overflow hidden, or a scroll box that needs scrolling);
// - "outside its figure": a label of an SVG drawing not wholly inside the drawing;
// - "labels on each other": two labels of one drawing that overlap;
// - "missing glyph": a character that no installed font draws (it shows as an empty box).
(() => {
  const problems = [];
  const width = document.documentElement.clientWidth;
  const describe = (el) => {
    const text = (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 80);
    const id = el.id ? `#${el.id}` : "";
    const cls = typeof el.className === "string" && el.className ? `.${el.className.split(" ")[0]}` : "";
    return `<${el.tagName.toLowerCase()}${id}${cls}> "${text}"`;
  };
  const clipping = ["auto", "hidden", "scroll", "clip"];
  const past = new Set();
  let elements = 0;
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest("svg") || el.tagName === "SCRIPT" || el.tagName === "STYLE") continue;
    elements += 1;
    const rect = el.getBoundingClientRect();
    if (rect.width && rect.right > width + 1) {
      past.add(el);
      if (!past.has(el.parentElement))
        problems.push({ kind: "past the right edge", what: describe(el), detail: `right edge ${Math.round(rect.right)} px of ${width}` });
    }
    const style = getComputedStyle(el);
    const cutX = clipping.includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1;
    const cutY = clipping.includes(style.overflowY) && el.scrollHeight > el.clientHeight + 1;
    if (cutX || cutY)
      problems.push({
        kind: "cut",
        what: describe(el),
        detail: cutX ? `${el.scrollWidth - el.clientWidth} px of ${el.scrollWidth} hidden sideways` : `${el.scrollHeight - el.clientHeight} px hidden below`,
      });
  }
  let labels = 0;
  for (const svg of document.querySelectorAll("svg")) {
    const frame = svg.getBoundingClientRect();
    const title = (svg.closest("figure") && svg.closest("figure").getAttribute("aria-label")) || "a figure";
    const boxes = [];
    for (const text of svg.querySelectorAll("text")) {
      if (!text.textContent.trim()) continue;
      labels += 1;
      const r = text.getBoundingClientRect();
      if (r.left < frame.left - 1 || r.top < frame.top - 1 || r.right > frame.right + 1 || r.bottom > frame.bottom + 1)
        problems.push({ kind: "outside its figure", what: `"${text.textContent.trim()}" in ${title.slice(0, 60)}`, detail: `label ${Math.round(r.left)},${Math.round(r.top)}–${Math.round(r.right)},${Math.round(r.bottom)}; figure ${Math.round(frame.left)},${Math.round(frame.top)}–${Math.round(frame.right)},${Math.round(frame.bottom)}` });
      boxes.push([text.textContent.trim(), r]);
    }
    for (let i = 0; i < boxes.length; i++)
      for (let j = i + 1; j < boxes.length; j++) {
        const [a, ra] = boxes[i];
        const [b, rb] = boxes[j];
        const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
        const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
        if (w > 1 && h > 1)
          problems.push({ kind: "labels on each other", what: `"${a}" and "${b}" in ${title.slice(0, 60)}`, detail: `${Math.round(w)} × ${Math.round(h)} px overlap` });
      }
  }
  // A character no font draws is drawn as the font's .notdef box, the same box as for a code point no font
  // has (U+10FFFD, private use): compare the two drawings in the element's own font.
  const canvas = document.createElement("canvas");
  canvas.width = 64;
  canvas.height = 64;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const drawing = (font, ch) => {
    ctx.clearRect(0, 0, 64, 64);
    ctx.font = font;
    ctx.fillText(ch, 4, 44);
    return ctx.getImageData(0, 0, 64, 64).data.join(",");
  };
  const byFont = new Map();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (!parent || parent.closest("script, style")) continue;
    const style = getComputedStyle(parent);
    const font = `${style.fontStyle} ${style.fontWeight} 40px ${style.fontFamily}`;
    if (!byFont.has(font)) byFont.set(font, new Map());
    for (const ch of node.textContent) if (ch.codePointAt(0) > 0x7e && ch.trim()) byFont.get(font).set(ch, parent);
  }
  let characters = 0;
  for (const [font, chars] of byFont) {
    const box = drawing(font, "\u{10FFFD}");
    for (const [ch, parent] of chars) {
      characters += 1;
      if (drawing(font, ch) === box)
        problems.push({ kind: "missing glyph", what: `${ch} (U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}) in ${describe(parent)}`, detail: font });
    }
  }
  return { problems, checked: { width, elements, labels, characters } };
})()
