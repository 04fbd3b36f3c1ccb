// The Snowball English stemmer ("Porter 2"), written from the published algorithm
// (snowballstem.org, algorithms/english.sbl) so that the lite engine's terms equal the Python
// engine's (PyStemmer). Input: a lower-case word; tests compare it with PyStemmer word by word.

const VOWELS = "aeiouy";
const VALID_LI = "cdeghkmnrt";
const EXCEPTION1 = new Map([
  ["skis", "ski"], ["skies", "sky"],
  ["idly", "idl"], ["gently", "gentl"], ["ugly", "ugli"], ["early", "earli"], ["only", "onli"],
  ["singly", "singl"], ["sky", "sky"], ["news", "news"], ["howe", "howe"], ["atlas", "atlas"],
  ["cosmos", "cosmos"], ["bias", "bias"], ["andes", "andes"],
]);
const EED_KEEP = new Set(["proc", "exc", "succ"]); // proceed, exceed, succeed
const ING_KEEP = new Set(["inn", "out", "cann", "herr", "earr", "even"]); // inning, outing, ...
const PREFIXES = ["gener", "commun", "arsen", "past", "univers", "later", "emerg", "organ", "inter"];
const DOUBLES = new Set(["bb", "dd", "ff", "gg", "mm", "nn", "pp", "rr", "tt"]);
const STEP2 = [
  ["ational", "ate"], ["tional", "tion"], ["enci", "ence"], ["anci", "ance"], ["abli", "able"],
  ["entli", "ent"], ["ization", "ize"], ["izer", "ize"], ["ation", "ate"], ["ator", "ate"],
  ["alism", "al"], ["aliti", "al"], ["alli", "al"], ["fulness", "ful"], ["ousli", "ous"],
  ["ousness", "ous"], ["iveness", "ive"], ["iviti", "ive"], ["biliti", "ble"], ["bli", "ble"],
  ["ogist", "og"], ["ogi", "og"], ["fulli", "ful"], ["lessli", "less"], ["li", ""],
];
const STEP3 = [
  ["ational", "ate"], ["tional", "tion"], ["alize", "al"], ["icate", "ic"], ["iciti", "ic"],
  ["ical", "ic"], ["ful", ""], ["ness", ""], ["ative", ""],
];
const STEP4 = [
  "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ism", "ate",
  "iti", "ous", "ive", "ize", "ion",
];

const isVowel = (c) => c !== undefined && VOWELS.includes(c);

/** The longest of `suffixes` that `w` ends with (entries are strings or [suffix, ...] pairs). */
function longest(w, suffixes) {
  let best = null;
  for (const entry of suffixes) {
    const s = typeof entry === "string" ? entry : entry[0];
    if (w.endsWith(s) && (best === null || s.length > (typeof best === "string" ? best : best[0]).length)) {
      best = entry;
    }
  }
  return best;
}

/** Is there a vowel in `w` before index `end`? */
function vowelBefore(w, end) {
  for (let i = 0; i < end; i += 1) if (isVowel(w[i])) return true;
  return false;
}

/** Does `w` end (at index `end`) in a short syllable? */
function shortSyllable(w, end) {
  if (w.slice(0, end).endsWith("past")) return true; // pasted, pasting
  const c = w[end - 1];
  const b = w[end - 2];
  if (end < 2 || isVowel(c) || !isVowel(b)) return false;
  if (end === 2) return true; // a vowel at the start followed by a non-vowel
  const a = w[end - 3];
  return !isVowel(a) && !"wxY".includes(c);
}

/** Region start: after the first non-vowel that follows a vowel, from `from`. */
function regionAfter(w, from) {
  for (let i = from + 1; i < w.length; i += 1) {
    if (!isVowel(w[i]) && isVowel(w[i - 1])) return i + 1;
  }
  return w.length;
}

/** The Snowball English stem of a lower-case word. */
export function snowballEnglish(word) {
  if (EXCEPTION1.has(word)) return EXCEPTION1.get(word);
  if (word.length < 3) return word;
  let w = word;
  if (w.startsWith("'")) w = w.slice(1);
  // prelude: y at the start or after a vowel is a consonant (Y)
  let yFound = false;
  const chars = [...w];
  for (let i = 0; i < chars.length; i += 1) {
    if (chars[i] === "y" && (i === 0 || isVowel(chars[i - 1]))) {
      chars[i] = "Y";
      yFound = true;
    }
  }
  w = chars.join("");
  // regions
  let p1 = w.length;
  const prefix = PREFIXES.find((p) => w.startsWith(p));
  if (prefix) {
    p1 = prefix.length;
  } else {
    let i = 0;
    while (i < w.length && !isVowel(w[i])) i += 1;
    while (i < w.length && isVowel(w[i])) i += 1;
    p1 = i < w.length ? i + 1 : w.length;
  }
  let p2 = w.length;
  if (p1 < w.length) {
    let i = p1;
    while (i < w.length && !isVowel(w[i])) i += 1;
    while (i < w.length && isVowel(w[i])) i += 1;
    p2 = i < w.length ? i + 1 : w.length;
  }
  if (p1 >= w.length) p2 = w.length;
  w = step1a(w);
  w = step1b(w, p1);
  w = step1c(w);
  w = step2(w, p1);
  w = step3(w, p1, p2);
  w = step4(w, p2);
  w = step5(w, p1, p2);
  return yFound ? w.replace(/Y/g, "y") : w;
}

function step1a(w) {
  const apostrophe = longest(w, ["'", "'s", "'s'"]);
  if (apostrophe) w = w.slice(0, -apostrophe.length);
  const s = longest(w, ["sses", "ied", "ies", "s", "us", "ss"]);
  if (s === "sses") return `${w.slice(0, -4)}ss`;
  if (s === "ied" || s === "ies") return w.length - 3 >= 2 ? `${w.slice(0, -3)}i` : `${w.slice(0, -3)}ie`;
  if (s === "s" && w.length >= 2 && vowelBefore(w, w.length - 2)) return w.slice(0, -1);
  return w;
}

function step1b(w, p1) {
  const s = longest(w, ["eed", "eedly", "ed", "edly", "ing", "ingly"]);
  if (s === null) return w;
  const start = w.length - s.length;
  const before = w.slice(0, start);
  if (s === "eed" || s === "eedly") {
    if (EED_KEEP.has(before)) return w;
    return start >= p1 ? `${before}ee` : w;
  }
  if (s === "ing") {
    if (before.length === 2 && before[1] === "y" && !isVowel(before[0])) return `${before[0]}ie`;
    if (ING_KEEP.has(before)) return w;
  }
  if (!vowelBefore(w, start)) return w;
  w = w.slice(0, start);
  const end2 = w.slice(-2);
  if (end2 === "at" || end2 === "bl" || end2 === "iz") return `${w}e`;
  if (DOUBLES.has(end2)) {
    if (w.length === 3 && "aeo".includes(w[0])) return w;
    return w.slice(0, -1);
  }
  if (w.length === p1 && shortSyllable(w, w.length)) return `${w}e`;
  return w;
}

function step1c(w) {
  const last = w[w.length - 1];
  if ((last === "y" || last === "Y") && w.length > 2 && !isVowel(w[w.length - 2])) {
    return `${w.slice(0, -1)}i`;
  }
  return w;
}

function step2(w, p1) {
  const hit = longest(w, STEP2);
  if (hit === null) return w;
  const [s, r] = hit;
  const start = w.length - s.length;
  if (start < p1) return w;
  if (s === "ogi") return w[start - 1] === "l" ? w.slice(0, start) + r : w;
  if (s === "li") return VALID_LI.includes(w[start - 1] ?? "") ? w.slice(0, start) : w;
  return w.slice(0, start) + r;
}

function step3(w, p1, p2) {
  const hit = longest(w, STEP3);
  if (hit === null) return w;
  const [s, r] = hit;
  const start = w.length - s.length;
  if (start < p1) return w;
  if (s === "ative") return start >= p2 ? w.slice(0, start) : w;
  return w.slice(0, start) + r;
}

function step4(w, p2) {
  const s = longest(w, STEP4);
  if (s === null) return w;
  const start = w.length - s.length;
  if (start < p2) return w;
  if (s === "ion") return w[start - 1] === "s" || w[start - 1] === "t" ? w.slice(0, start) : w;
  return w.slice(0, start);
}

function step5(w, p1, p2) {
  const last = w[w.length - 1];
  const start = w.length - 1;
  if (last === "e") {
    if (start >= p2 || (start >= p1 && !shortSyllable(w, start))) return w.slice(0, start);
  } else if (last === "l") {
    if (start >= p2 && w[start - 1] === "l") return w.slice(0, start);
  }
  return w;
}
