//! [`render`]: a [`ReportModel`] -> one self-contained HTML page (inline CSS, script and data).

use super::model::ReportModel;

const CSS: &str = include_str!("page.css");
const JS: &str = include_str!("page.js");

/// `s` escaped for HTML text and attribute values.
pub fn escape_html(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

/// JSON made safe inside `<script type="application/json">`: `</` becomes `<\/` and `<!--`
/// becomes `\u003c!--` (both still the same JSON).
pub fn script_json(json: &str) -> String {
    json.replace("</", "<\\/").replace("<!--", "\\u003c!--")
}

/// The page of one job (pure: the same model gives the same bytes).
pub fn render(m: &ReportModel) -> String {
    let data = serde_json::to_string(m).expect("the report model serialises");
    let ep = if m.ep.is_some() {
        "<section id=\"ep\"><h2>Expert parallel: MoE EP wait matrices</h2><div class=\"body\"></div></section>\n"
    } else {
        ""
    };
    let mut html = String::with_capacity(data.len() + CSS.len() + JS.len() + 4096);
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    html.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    html.push_str(&format!(
        "<title>CommInsight report: {}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n",
        escape_html(&m.job)
    ));
    html.push_str(&format!(
        r#"<header><h1>CommInsight report: <span id="job">{job}</span></h1><div class="meta" id="meta"></div></header>
<div id="errors"></div>
<noscript><p>This report draws its charts with JavaScript; enable it for this file.</p></noscript>
<main>
<section id="summary"><h2>Job summary</h2><div class="body"></div></section>
<section id="steps"><h2>Step duration</h2><div id="stepchart"></div></section>
<section id="heatmap"><h2>Straggler index on the parallel grid</h2>
<div class="controls"><label>index <select id="metricsel"><option value="root">root cause (whose own slowness started the waiting)</option><option value="seed">seed (who made others wait)</option></select></label>
<label>show <select id="stepsel"></select></label>
<label>rank <input id="rankfind" type="number" min="0" style="width:7em" placeholder="go to rank"></label>
<span class="note">hover a cell for its rank, click it for the details</span></div>
<div class="hmrow"><div id="hmwrap"><canvas id="hm" width="10" height="10"></canvas><div id="tip"></div></div>
<aside id="drill"><p class="note">click a rank</p></aside></div>
<div id="legend">index 0 <canvas id="legendbar" width="240" height="12"></canvas> <span id="legendmax"></span></div>
<p class="note" id="hmnote"></p>
<p class="note" id="opsnote"></p>
<div id="agg"></div>
</section>
<section id="hang"><h2>Hang verdicts</h2><div class="body"></div></section>
{ep}<section id="traces"><h2>Perfetto traces of the interesting steps</h2><div class="body"></div></section>
</main>
"#,
        job = escape_html(&m.job),
    ));
    html.push_str("<script type=\"application/json\" id=\"data\">");
    html.push_str(&script_json(&data));
    html.push_str("</script>\n<script>\n");
    html.push_str(JS);
    html.push_str("</script>\n</body>\n</html>\n");
    html
}
